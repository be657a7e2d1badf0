"""Loading the user's module and tracing it with make_fx into an ATen graph whose nodes know the
module path and user source line they come from."""
import importlib.util
import inspect
import os
import sys
import traceback

import torch
from torch.fx.experimental import proxy_tensor

from .errors import ExportError
from .recurrent import Unrolled, check_recurrent


def load_module(spec_text):
    path, sep, factory = spec_text.rpartition(":")
    if not sep or not path or not factory:
        raise ExportError(f"'{spec_text}': expected FILE.py:FACTORY, e.g. models.py:gpt")
    if not os.path.isfile(path):
        raise ExportError(f"{path}: no such file")
    spec = importlib.util.spec_from_file_location("sluice_user_module", path)
    if spec is None or spec.loader is None:
        raise ExportError(f"{path}: not a Python file (expected FILE.py:FACTORY, e.g. models.py:gpt)")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        raise ExportError(f"{path}: importing it raised {type(e).__name__}: {e}") from e
    fn = getattr(mod, factory, None)
    if fn is None or not callable(fn):
        raise ExportError(f"{path} has no function '{factory}'")
    try:
        module = fn()
    except Exception as e:
        raise ExportError(f"{path}:{factory}() raised {type(e).__name__}: {e}") from e
    if not isinstance(module, torch.nn.Module):
        raise ExportError(f"{path}:{factory}() returned {type(module).__name__}, not a torch.nn.Module")
    if not list(module.parameters()):
        raise ExportError(f"{path}:{factory}() returned a module with no parameters: nothing to train")
    return module, os.path.abspath(path)


def check_modules(module):
    """Refuses modules whose forward the trace cannot follow: recurrent layers that
    recurrent.unrolled_forward does not compute (recurrent.check_recurrent), batch norms without
    a fixed momentum or running statistics."""
    for path, sub in module.named_modules():
        if isinstance(sub, torch.nn.RNNBase):
            check_recurrent(path, sub)
        if isinstance(sub, torch.nn.modules.batchnorm._BatchNorm) and sub.training:
            if sub.momentum is None:
                raise ExportError(f"module '{path}' is a batch norm with momentum=None (a "
                                  f"cumulative average, 1 / num_batches_tracked, which changes "
                                  f"every step): sluice's running statistics take a fixed "
                                  f"momentum; give one (PyTorch's default is 0.1)")
            if not sub.track_running_stats:
                raise ExportError(f"module '{path}' is a batch norm with "
                                  f"track_running_stats=False (the batch's statistics in "
                                  f"evaluation too): sluice evaluates batch norm by its running "
                                  f"statistics; keep track_running_stats=True")


def remove_dropout(module):
    """--without-dropout: every nn.Dropout (and nn.MultiheadAttention's attention dropout) of the
    module set to p = 0, as module.eval() would for them alone; returns [(module path, p)] of
    those that had p > 0. A functional F.dropout with p > 0 in forward stays a dropout."""
    removed = []
    for path, sub in module.named_modules():
        if isinstance(sub, torch.nn.modules.dropout._DropoutNd) and sub.p > 0:
            removed.append((path, sub.p))
            sub.p = 0.0
        elif isinstance(sub, torch.nn.MultiheadAttention) and sub.dropout > 0:
            removed.append((f"{path} (attention)", sub.dropout))
            sub.dropout = 0.0
    return removed


def parameter_aliases(module):
    """[(name, Parameter, [(owner module, attribute), ...])] in named_parameters() order; a tied
    Parameter appears once, under its first name, with every (module, attribute) holding it.
    Frozen parameters (requires_grad False) are left out: PyTorch never trains them, so they are
    read as constants, as buffers are (see frozen_parameters)."""
    names = {id(p): n for n, p in module.named_parameters()}
    order = [n for n, p in module.named_parameters() if p.requires_grad]
    holders = {}
    for _, sub in module.named_modules(remove_duplicate=False):
        for attr, p in sub._parameters.items():
            if p is not None and id(p) in names:
                holders.setdefault(id(p), []).append((sub, attr))
    out = []
    for n, p in module.named_parameters():
        if not p.requires_grad:
            continue
        hs = list(dict.fromkeys(holders[id(p)]))
        out.append((n, p, hs))
    assert [n for n, _, _ in out] == order
    return out


def frozen_parameters(module):
    """{id(Parameter): name} of the parameters with requires_grad False."""
    return {id(p): n for n, p in module.named_parameters() if not p.requires_grad}


def block_paths(module):
    """Module paths of the units: each element of an outermost nn.ModuleList/nn.Sequential."""
    paths = []
    for path, sub in module.named_modules():
        if not isinstance(sub, (torch.nn.ModuleList, torch.nn.Sequential)) or not path:
            continue
        if any(path.startswith(p + ".") for p in paths):
            continue  # inside a block already
        for name, _ in sub.named_children():
            paths.append(f"{path}.{name}")
    return paths


class _Recorder:
    """The module path and user source line current while tracing, stamped on every node."""

    def __init__(self, module, user_file):
        self.stack = [""]
        self.user_file = user_file
        self.handles = []
        for path, sub in module.named_modules():
            self.handles.append(sub.register_forward_pre_hook(self._enter(path)))
            self.handles.append(sub.register_forward_hook(self._leave()))

    def _enter(self, path):
        def hook(mod, args):
            self.stack.append(path)
        return hook

    def _leave(self):
        def hook(mod, args, out):
            self.stack.pop()
        return hook

    def source_line(self):
        for frame in reversed(traceback.extract_stack()):
            if os.path.abspath(frame.filename) == self.user_file:
                return f"{frame.filename}:{frame.lineno}: {frame.line}"
        return None

    def remove(self):
        for h in self.handles:
            h.remove()


def _loss_of(result):
    """The loss in what forward returned: the result itself, or of a tuple or list (nanoGPT's
    `return logits, loss`, a `(loss, logits)`) its one float scalar, the other elements left out;
    a sequence without exactly one float scalar is refused, saying what it holds."""
    if not isinstance(result, (tuple, list)):
        return result
    scalars = [r for r in result
               if isinstance(r, torch.Tensor) and r.dim() == 0 and r.is_floating_point()]
    if len(scalars) == 1:
        return scalars[0]
    held = ", ".join(f"{type(r).__name__}" if not isinstance(r, torch.Tensor)
                     else f"{r.dtype} of shape {list(r.shape)}" for r in result)
    raise ExportError(f"forward returns a {type(result).__name__} of {len(result)} ({held}): "
                      f"{len(scalars)} float scalars, so no one of them is the loss; return the mean "
                      f"loss, alone or as the only float scalar of the tuple")


def forward_arguments(module):
    """The names of module.forward's arguments, in order; refuses *args, **kwargs and keyword-only
    arguments, which the exporter could not bind to inputs."""
    try:
        sig = inspect.signature(module.forward)
    except (TypeError, ValueError) as e:
        raise ExportError(f"cannot read the arguments of {type(module).__name__}.forward: {e}") from e
    names = []
    for name, p in sig.parameters.items():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise ExportError(f"{type(module).__name__}.forward({', '.join(sig.parameters)}): "
                              f"argument '{name}' is not positional; every argument must be an "
                              f"input of the program (a data array)")
        names.append(name)
    return names


def trace(module, aliases, user_file, examples, arg_names):
    """The ATen graph of module(*examples), parameters as placeholders (after the inputs), its
    recurrent layers unrolled (recurrent.Unrolled; gm.unrolled_steps says over how many steps)."""
    recorder = _Recorder(module, user_file)

    class Tracer(proxy_tensor.PythonKeyTracer):
        def create_node(self, *args, **kwargs):
            node = super().create_node(*args, **kwargs)
            node.meta["module_path"] = recorder.stack[-1]
            node.meta["source"] = recorder.source_line()
            return node

    count = len(examples)

    def call(*values):
        inputs, params = values[:count], values[count:]
        saved = []
        for (_, _, holders), p in zip(aliases, params):
            for owner, attr in holders:
                saved.append((owner, attr, owner._parameters[attr]))
                owner._parameters[attr] = p
        try:
            return _loss_of(module(*inputs))
        finally:
            for owner, attr, p in reversed(saved):
                owner._parameters[attr] = p

    params = [p.detach().clone() for _, p, _ in aliases]
    original = proxy_tensor.PythonKeyTracer
    proxy_tensor.PythonKeyTracer = Tracer
    shapes = ", ".join(f"{n} {list(t.shape)}" for n, t in zip(arg_names, examples))
    try:
        with Unrolled(module) as unrolled:
            gm = proxy_tensor.make_fx(call)(*examples, *params)
        gm.unrolled_steps = unrolled.steps  # {recurrent layer: steps}, for the report
    except ExportError:
        raise
    except Exception as e:
        where = ""
        for frame in reversed(traceback.extract_tb(e.__traceback__)):
            if os.path.abspath(frame.filename) == user_file:
                where = f" (at {frame.filename}:{frame.lineno}: {frame.line})"
                break
        raise ExportError(f"tracing forward({', '.join(arg_names)}) at {shapes} failed{where}: "
                          f"{type(e).__name__}: {e}") from e
    finally:
        proxy_tensor.PythonKeyTracer = original
        recorder.remove()
    return gm, list(examples) + params
