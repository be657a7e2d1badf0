"""Plain PyTorch modules that tools/torch_export.py imports in the parity tests
(tests/train/torch_import_parity_test.cc) and in docs/guide.md's "From PyTorch".

Each factory returns a module whose forward(tokens, targets) (int64 [B, T] each) returns the mean
next-token cross-entropy; targets of -1 are ignored (sluice's data marks the prompt of `sort` so).
The modules are written as people write them, not for sluice: nn.Linear weights [out, in], shapes
read with `B, T = x.shape`, the attention spelt out with a mask, a weight tied between two modules.

  gpt      nanoGPT-style: token and position embeddings, pre-norm blocks in an nn.ModuleList
           (causal self-attention from a registered tril mask, GELU MLP), final LayerNorm, an output
           head tied to the token embedding.
  mlp_lm   not a transformer: token and position embeddings, then residual per-token MLP blocks in
           an nn.Sequential (LayerNorm, SiLU, ReLU), a separate output head with a bias.

The sizes suit `sluice train --data sort` (vocabulary 11, sequences of 12).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, seq):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.c_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, dim, heads, seq):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, seq)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab=11, seq=12, dim=32, heads=2, layers=2):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.h = nn.ModuleList([Block(dim, heads, seq) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens, targets):
        B, T = tokens.shape
        pos = torch.arange(0, T, dtype=torch.long)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


class ResidualMLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.mid = nn.Linear(hidden, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        h = F.silu(self.up(self.norm(x)))
        h = torch.relu(self.mid(h))
        return x + self.down(h)


class MlpLM(nn.Module):
    def __init__(self, vocab=11, seq=12, dim=24, hidden=48, layers=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.1)
        self.blocks = nn.Sequential(*[ResidualMLP(dim, hidden) for _ in range(layers)])
        self.out = nn.Linear(dim, vocab)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.embed(tokens) + self.pos[:T]
        x = self.blocks(x)
        logits = self.out(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=-1)


def gpt():
    torch.manual_seed(0)
    return GPT()


def mlp_lm():
    torch.manual_seed(0)
    return MlpLM()
