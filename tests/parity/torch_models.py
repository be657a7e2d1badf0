"""Plain PyTorch modules that tools/torch_export.py imports in the parity tests
(tests/train/torch_import_parity_test.cc) and in docs/guide.md's "From PyTorch".

Each factory returns a module whose forward(tokens, targets) (int64 [B, T] each) returns the mean
next-token cross-entropy; targets of -1 are ignored (sluice's data marks the prompt of `sort` so).
The modules are written as people write them, not for sluice: nn.Linear weights [out, in], shapes
read with `B, T = x.shape`, the attention spelt out with a mask, a weight tied between two modules.

  gpt      nanoGPT-style: token and position embeddings, pre-norm blocks in an nn.ModuleList
           (causal self-attention from a registered tril mask, GELU MLP), final LayerNorm, an output
           head tied to the token embedding.
  llama    Llama-style: RMSNorm written out (pow, mean, rsqrt, mul), rotary positions from
           precomputed cos/sin tables (registered buffers) applied with slicing, cat and neg,
           grouped-query attention (fewer key/value heads than query heads, repeat_interleave),
           a SwiGLU MLP (SiLU), an additive causal mask buffer, no biases, the output head tied to
           the token embedding.
  mlp_lm   not a transformer: token and position embeddings, then residual per-token MLP blocks in
           an nn.Sequential (LayerNorm, SiLU, ReLU), a separate output head with a bias.

  seq_mlp  what a user writes first: an nn.Sequential MLP (Linear, ReLU, LayerNorm, Tanh,
           Dropout(0), SiLU) over token embeddings; the position embedding is frozen
           (requires_grad False), so it is a constant neither framework trains.
  unused_head  seq_mlp's layers with a second output head forward never uses (as an imported module
           keeps a head for another task): PyTorch leaves its .grad None and AdamW skips it, weight
           decay included.
  bert_mlm a BERT-style encoder trained as a masked LM is trained here on next tokens: token and
           learned position embeddings with an embedding LayerNorm, bidirectional self-attention
           (no mask; query, key, value as separate nn.Linear), post-norm layers with an exact-GELU
           MLP, the MLM head's transform (GELU with approximate='tanh', LayerNorm) and a decoder
           tied to the token embedding with a bias of its own; the key biases are frozen (see
           BertMLM).
  encoder  two nn.TransformerEncoderLayer (PyTorch's own, with nn.MultiheadAttention; pre-norm,
           GELU, no dropout) in an nn.ModuleList, causal by a boolean src_mask buffer (which
           MultiheadAttention adds to the scores by baddbmm), then a linear head; the attention's
           in_proj_bias is frozen (see Encoder).
  encoder_dropout  the encoder with nn.TransformerEncoderLayer's default dropout 0.1 (attention
           weights, feed-forward, both residual branches): eight sluice dropouts.
  lstm_lm  an LSTM language model: token embeddings, a 2-layer nn.LSTM (batch_first, no initial
           state), a linear head; exported for sequences of exactly --seq (the recurrence is
           unrolled over them).

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


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.heads // self.kv_heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim) + mask
        y = F.softmax(scores, dim=-1) @ v
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = LlamaAttention(dim, heads, kv_heads)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = SwiGLU(dim, hidden)

    def forward(self, x, cos, sin, mask):
        x = x + self.attention(self.attention_norm(x), cos, sin, mask)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab=11, seq=12, dim=32, heads=4, kv_heads=2, hidden=64, layers=2,
                 theta=10000.0):
        super().__init__()
        head_dim = dim // heads
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(
            [LlamaBlock(dim, heads, kv_heads, hidden) for _ in range(layers)])
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        self.output.weight = self.tok_embeddings.weight  # tied
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
        freqs = torch.outer(torch.arange(seq).float(), inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)  # [seq, head_dim]
        self.register_buffer("rope_cos", angles.cos())
        self.register_buffer("rope_sin", angles.sin())
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1))
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens, targets):
        B, T = tokens.shape
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        mask = self.mask[:T, :T]
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        logits = self.output(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def gpt():
    torch.manual_seed(0)
    return GPT()


def llama():
    torch.manual_seed(0)
    return Llama()


def mlp_lm():
    torch.manual_seed(0)
    return MlpLM()


class LstmLM(nn.Module):
    def __init__(self, vocab=11, dim=16, hidden=32, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, num_layers=layers, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, tokens, targets):
        h, _ = self.lstm(self.embed(tokens))
        logits = self.out(h)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=-1)


def lstm_lm():
    torch.manual_seed(0)
    return LstmLM()


class SeqMLP(nn.Module):
    def __init__(self, vocab=11, seq=12, dim=16, hidden=32):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.wpe.weight.requires_grad_(False)
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.LayerNorm(hidden),
                                 nn.Linear(hidden, hidden), nn.Tanh(), nn.Dropout(0.0),
                                 nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, vocab))

    def forward(self, tokens, targets):
        B, T = tokens.shape
        logits = self.net(self.wte(tokens) + self.wpe(torch.arange(T)))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


class Encoder(nn.Module):
    def __init__(self, vocab=11, seq=12, dim=16, heads=2, layers=2, dropout=0.0):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.layers = nn.ModuleList([
            nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=dropout, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(layers)])
        # The key third of in_proj_bias has a true gradient of zero (softmax ignores a shift
        # shared by every key), and AdamW turns the rounding noise of each framework into steps of
        # up to lr that differ (4e-3 apart after ten steps): frozen, as a user may freeze it, so
        # that the final weights compare within the test's 2e-3.
        for layer in self.layers:
            layer.self_attn.in_proj_bias.requires_grad_(False)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("causal", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))

    def forward(self, tokens, targets):
        B, T = tokens.shape
        x = self.wte(tokens) + self.wpe(torch.arange(T))
        for layer in self.layers:
            x = layer(x, src_mask=self.causal[:T, :T])
        logits = self.head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


class UnusedHead(nn.Module):
    def __init__(self, vocab=11, dim=16, hidden=32):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, vocab))
        self.aux_head = nn.Linear(dim, vocab)  # another task's head: forward never calls it

    def forward(self, tokens, targets):
        logits = self.net(self.wte(tokens))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def seq_mlp():
    torch.manual_seed(0)
    return SeqMLP()


def encoder():
    torch.manual_seed(0)
    return Encoder()


def encoder_dropout():
    """The encoder with nn.TransformerEncoderLayer's default dropout, 0.1: on the attention
    weights, inside the feed-forward and on both residual branches of every layer."""
    torch.manual_seed(0)
    return Encoder(dropout=0.1)


def unused_head():
    torch.manual_seed(0)
    return UnusedHead()


class BertSelfAttention(nn.Module):
    """Bidirectional multi-head self-attention as BERT writes it; `pad` [B, T] (1 at a token, 0
    at padding) masks the padding keys out."""

    def __init__(self, dim, heads, additive_mask=False):
        super().__init__()
        self.heads = heads
        self.additive_mask = additive_mask  # (1 - pad) * -10000 added, as Hugging Face's BERT
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.output = nn.Linear(dim, dim)
        # The key bias has a true gradient of zero (softmax ignores a shift shared by every key):
        # each framework's rounding noise becomes AdamW steps of up to lr that differ, so it is
        # frozen for the weights to compare (as Encoder's in_proj_bias).
        self.key.bias.requires_grad_(False)

    def forward(self, x, pad=None):
        B, T, C = x.shape
        h = self.heads
        q = self.query(x).view(B, T, h, C // h).permute(0, 2, 1, 3)
        k = self.key(x).view(B, T, h, C // h).permute(0, 2, 1, 3)
        v = self.value(x).view(B, T, h, C // h).permute(0, 2, 1, 3)
        scores = q @ k.transpose(-1, -2) / math.sqrt(C // h)
        if pad is not None and self.additive_mask:
            scores = scores + (1.0 - pad[:, None, None, :].float()) * -10000.0
        elif pad is not None:
            scores = scores.masked_fill(pad[:, None, None, :] == 0, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.output(y.permute(0, 2, 1, 3).reshape(B, T, C))


class BertLayer(nn.Module):
    def __init__(self, dim, heads, additive_mask=False):
        super().__init__()
        self.attention = BertSelfAttention(dim, heads, additive_mask)
        self.attention_norm = nn.LayerNorm(dim, eps=1e-12)
        self.intermediate = nn.Linear(dim, 4 * dim)
        self.output = nn.Linear(4 * dim, dim)
        self.output_norm = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, x, pad=None):
        x = self.attention_norm(x + self.attention(x, pad))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class BertEmbeddings(nn.Module):
    def __init__(self, vocab, seq, dim):
        super().__init__()
        self.word = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(seq, dim)
        self.norm = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, tokens):
        T = tokens.shape[1]
        return self.norm(self.word(tokens) + self.position(torch.arange(T)))


class BertMLM(nn.Module):
    def __init__(self, vocab=11, seq=12, dim=32, heads=2, layers=2):
        super().__init__()
        self.embeddings = BertEmbeddings(vocab, seq, dim)
        self.layers = nn.ModuleList([BertLayer(dim, heads) for _ in range(layers)])
        self.transform = nn.Linear(dim, dim)
        self.transform_norm = nn.LayerNorm(dim, eps=1e-12)
        self.decoder = nn.Linear(dim, vocab)
        self.decoder.weight = self.embeddings.word.weight  # tied; the decoder keeps its bias

    def forward(self, tokens, targets):
        x = self.embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        x = self.transform_norm(F.gelu(self.transform(x), approximate="tanh"))
        logits = self.decoder(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def bert_mlm():
    torch.manual_seed(0)
    return BertMLM()

