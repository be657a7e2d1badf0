#!/usr/bin/python3
"""Bad input to tools/torch_export.py (docs/torch-export.md, "Limits"): each case is a clear error
that names the problem and where, exit status 1, and nothing written (no DIR, no temporary folder
beside it). The modules are in tests/parity/bad_modules.py; one valid export checks that the
cases fail for their own reason. Exits 77 (skipped, saying why) without python3-torch.

Run by ctest as torch_export_bad_input (class BadInput), torch_export_arrays (class ArrayInput)
and torch_export_recurrent (class RecurrentForward: the unrolled recurrent layers against
PyTorch's own); by hand: /usr/bin/python3 tests/parity/torch_export_test.py [BadInput|...]
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXPORTER = os.path.join(ROOT, "tools", "torch_export.py")
MODULES = os.path.join(HERE, "bad_modules.py")


def line_of(text):
    """'bad_modules.py:N: TEXT' for the line of bad_modules.py that starts with TEXT."""
    with open(MODULES) as f:
        for n, line in enumerate(f, 1):
            if line.strip().startswith(text):
                return f"bad_modules.py:{n}: {text}"
    raise AssertionError(f"no line starts with {text!r} in {MODULES}")


class ExportCase(unittest.TestCase):
    """A scratch folder per test, the exporter run in it, and the checks of a refusal."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="torch_export_test.")
        self.parent = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def export(self, spec, out=None, batch="2", seq="6", extra=()):
        out = out or os.path.join(self.parent, "out")
        sizes = ["--batch", batch] + (["--seq", seq] if seq is not None else [])
        return subprocess.run([sys.executable, EXPORTER, spec, *sizes, "--out", out, *extra],
                              capture_output=True, text=True), out

    def refused(self, spec, *expected, out=None, seq="6", extra=()):
        before = sorted(os.listdir(self.parent))
        result, out = self.export(spec, out, seq=seq, extra=extra)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertEqual(result.stdout, "")
        for text in expected:
            self.assertIn(text, result.stderr)
        self.assertTrue(result.stderr.startswith("torch_export: error: "), result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        # Nothing written: the folder holds what it held before (no DIR, no .torch_export.*).
        self.assertEqual(sorted(os.listdir(self.parent)), before)
        return result.stderr


class BadInput(ExportCase):
    """Token models, and what every module may get wrong."""

    def test_a_valid_module_exports(self):
        result, out = self.export(f"{MODULES}:tiny")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(sorted(os.listdir(out)), ["init.safetensors", "model.sluice"])
        self.assertIn("units: ", result.stdout)

    def test_a_mask_buffer_becomes_a_constant_sliced_to_the_run(self):
        result, out = self.export(f"{MODULES}:additive_mask")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("constants and buffers (never trained): mask", result.stdout)
        with open(os.path.join(out, "model.sluice")) as f:
            text = f.read()
        self.assertIn("const %mask: f32[6, 6] = loaded", text)
        self.assertIn("slice(%mask) {axis = 0, end = T, start = 0}", text)
        self.assertNotIn("causal_attention", text)  # not causal: the attention stays written out

    def test_the_llama_gate_and_grouped_attention_are_fused(self):
        result, out = self.export(os.path.join(HERE, "torch_models.py") + ":llama", seq="12")
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(out, "model.sluice")) as f:
            text = f.read()
        # silu(w1(x)) * w3(x) is one swiglu; keys and values keep their 2 heads (no repeat copy)
        self.assertIn("= swiglu(%layers.0.feed_forward.w1._unsafe_view, "
                      "%layers.0.feed_forward.w3._unsafe_view)", text)
        self.assertNotIn("silu(", text)
        self.assertNotIn("broadcast_to", text)
        attention = [line for line in text.splitlines() if "causal_attention(" in line]
        self.assertEqual(len(attention), 2)
        self.assertIn("%layers.0.attention.bmm: f32[B, 4, T, 8]", attention[0])
        self.assertIn("= causal_attention(%layers.0.attention.add, %layers.0.attention.add_1, "
                      "%layers.0.attention.transpose_2)", attention[0])
        self.assertIn("%layers.0.attention.add_1: f32[B, 2, T, 8] = add(", text)

    def test_encoder_attention_is_fused(self):
        """BERT's attention without a mask becomes attention; nn.TransformerEncoderLayer's under a
        constant causal src_mask (nn.MultiheadAttention's baddbmm) causal_attention: no softmax
        over [B·H, T, T] scores stays."""
        for model, op in (("bert_mlm", "attention"), ("encoder", "causal_attention")):
            result, out = self.export(os.path.join(HERE, "torch_models.py") + ":" + model,
                                      out=os.path.join(self.parent, model), seq="12")
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(os.path.join(out, "model.sluice")) as f:
                text = f.read()
            self.assertEqual(text.count(f"= {op}("), 2, model)
            self.assertNotIn("softmax(", text)

    def test_a_mask_per_pair_of_positions_stays_written_out(self):
        result, out = self.export(f"{MODULES}:pair_mask")
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(out, "model.sluice")) as f:
            text = f.read()
        self.assertNotIn("attention", text)  # [B, 1, T, T]: not a key bias
        self.assertIn("= softmax(", text)

    def test_near_misses_of_the_fused_patterns_stay_written_out(self):
        result, out = self.export(f"{MODULES}:near_misses")
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(out, "model.sluice")) as f:
            text = f.read()
        self.assertNotIn("swiglu", text)  # the gate broadcasts a parameter: silu, then mul
        self.assertIn("= silu(", text)
        self.assertNotIn("causal_attention", text)  # the mask is not causal
        self.assertEqual(text.count("= broadcast_to("), 2)  # keys and values repeated: copies

    def test_a_factory_that_does_not_exist(self):
        self.refused(f"{MODULES}:nope", "bad_modules.py has no function 'nope'")

    def test_a_file_that_does_not_exist(self):
        self.refused(os.path.join(HERE, "no_such_file.py") + ":tiny", "no_such_file.py: no such file")

    def test_a_spec_without_a_factory(self):
        self.refused(MODULES, "expected FILE.py:FACTORY")

    def test_a_factory_that_raises(self):
        self.refused(f"{MODULES}:raises", "raises() raised ValueError: the factory's own error")

    def test_a_factory_that_returns_no_module(self):
        self.refused(f"{MODULES}:not_a_module", "not_a_module() returned int, not a torch.nn.Module")

    def test_a_module_with_no_parameters(self):
        self.refused(f"{MODULES}:no_parameters", "a module with no parameters")

    def test_a_forward_with_other_arguments(self):
        self.refused(f"{MODULES}:other_arguments", "OtherArguments.forward(tokens) takes 1 "
                     "argument(s): a token model is forward(tokens, targets)",
                     "--data FILE.safetensors or --input NAME=TYPE")

    def test_a_forward_with_a_non_scalar_result(self):
        self.refused(f"{MODULES}:not_scalar", "forward must return the mean loss, a float scalar",
                     "shape [1]")

    def test_a_tuple_result_with_one_float_scalar_exports_it_as_the_loss(self):
        # Regression: `return logits, loss` (nanoGPT) was refused as "not a tuple".
        result, out = self.export(f"{MODULES}:logits_and_loss")
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(out, "model.sluice")) as f:
            text = f.read()
        self.assertIn("cross_entropy", text)
        self.assertIn("output %loss", text)

    def test_a_tuple_result_with_two_float_scalars(self):
        self.refused(f"{MODULES}:two_scalars", "forward returns a tuple of 2",
                     "2 float scalars, so no one of them is the loss")

    def test_control_flow_on_values(self):
        self.refused(f"{MODULES}:branch_on_values", "data-dependent control flow",
                     line_of("if x.sum() > 0:"))

    def test_control_flow_on_sizes(self):
        self.refused(f"{MODULES}:branch_on_length", "in more than sizes (data-dependent control flow?)")

    def test_an_unsupported_op_names_op_module_and_line(self):
        self.refused(f"{MODULES}:cumulative", "unsupported ATen op aten.cumsum.default",
                     "in module 'mix'", line_of("return torch.cumsum(x, dim=1)"))

    def test_a_recurrent_layer_is_unrolled_over_the_sequence_length(self):
        # nn.GRU reads flat copies of its weights, not the Parameters the exporter swaps: it was
        # refused as "a constant tensor ... that comes from no buffer", then by name; now its
        # forward is unrolled over T = --seq, its weights the module's parameters.
        result, out = self.export(f"{MODULES}:recurrent")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("unrolled: rnn (torch.nn.GRU) over 6 steps: the program trains on "
                      "sequences of exactly 6", result.stdout)
        with open(os.path.join(out, "model.sluice")) as f:
            text = f.read()
        self.assertIn("  input %tokens: i64[B, 6] = tokens\n", text)
        for name in ("weight_ih_l0: f32[24, 8]", "weight_hh_l0: f32[24, 8]", "bias_ih_l0: f32[24]",
                     "bias_hh_l0: f32[24]"):
            self.assertIn(f"  param %rnn.{name} = loaded\n", text)
        # the input projection of all six steps is one product, cut into the steps without a copy
        self.assertEqual(text.count("%rnn.weight_ih_l0) {transpose_b = true}"), 1, text)
        self.assertIn("%rnn.mm: f32[6*B, 24] = matmul(", text)
        self.assertRegex(text, r"= split_view\(%rnn\.add\) "
                               r"\{axis = 0, sizes = \[1, 1, 1, 1, 1, 1\]\}")
        # five recurrent products: the first step's state is zero
        self.assertEqual(text.count("%rnn.weight_hh_l0) {transpose_b = true}"), 5, text)

    def test_packed_sequences_name_the_module(self):
        self.refused(f"{MODULES}:packed_lstm", "module 'rnn' (torch.nn.LSTM) is given a "
                     "PackedSequence", "packed sequences (pack_padded_sequence) are not mapped")

    def test_dropout_in_training_becomes_dropout(self):
        # PyTorch 1.13 traces dropout as empty_like, bernoulli_, div_, mul: it was refused (sluice
        # drew no masks); now one dropout, its mask drawn from the batch's random key.
        result, out = self.export(f"{MODULES}:dropout")
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(out, "model.sluice")) as f:
            text = f.read()
        self.assertIn("  input %random_key: i64[B] = random_key\n", text)
        self.assertIn("= dropout(%embed.embedding, %random_key) {p = 0.1, stream = 0}", text)
        self.assertNotIn("bernoulli", text)

    def test_every_dropout_of_transformer_layers_has_its_own_stream(self):
        # nn.TransformerEncoderLayer's default dropout 0.1, on the attention weights, inside the
        # feed-forward and on both residual branches of each of two layers: eight dropouts,
        # streams 0 to 7 in program order, one random_key input.
        result, out = self.export(f"{HERE}/torch_models.py:encoder_dropout", seq="12")
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(out, "model.sluice")) as f:
            text = f.read()
        streams = re.findall(r"= dropout\(%[\w.]+, %random_key\) \{p = 0\.1, stream = (\d+)\}",
                             text)
        self.assertEqual(streams, [str(i) for i in range(8)], text)
        self.assertEqual(text.count("= random_key\n"), 1)

    def test_without_dropout_says_what_it_left_out(self):
        # nn.TransformerEncoderLayer and BERT default to dropout 0.1: --without-dropout exports
        # them at p=0, saying so on the terminal and in the program's first line.
        result, out = self.export(f"{MODULES}:dropout", extra=["--without-dropout"])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("without dropout: drop (p=0.1): the program trains as the module would with "
                      "these at p=0, not as PyTorch trains it", result.stdout)
        with open(os.path.join(out, "model.sluice")) as f:
            self.assertEqual(f.readline(), "# without dropout (--without-dropout): drop p=0.1\n")

    def test_a_constant_mask_other_than_causal(self):
        # A mask computed from the inputs (a padding mask) becomes where(); a constant one that is
        # not causal has no mapping and is named as such.
        self.refused(f"{MODULES}:constant_mask", "masked_fill with a constant mask other than a "
                     "causal one", line_of("x = x.masked_fill(self.band[0], 0.0)"))

    def test_an_embedding_with_padding_idx(self):
        # padding_idx was dropped (sluice trained the row PyTorch never trains), then refused; now
        # embedding_grad leaves that row's gradient zero.
        result, out = self.export(f"{MODULES}:padding_idx")
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(out, "model.sluice")) as f:
            self.assertIn("embedding(%tokens, %embed.weight) {padding_idx = 0}", f.read())

    def test_an_embedding_with_max_norm(self):
        # embedding_renorm_ (nothing reads its result) was dropped: the weight was never
        # renormalised.
        self.refused(f"{MODULES}:max_norm", "nn.Embedding with max_norm", "drop max_norm")

    def test_an_in_place_op(self):
        # make_fx routes later reads of h through mul_, so it is an unmapped op (embedding_renorm_
        # above is the in-place op nothing reads).
        self.refused(f"{MODULES}:in_place", "unsupported ATen op aten.mul_.Tensor",
                     line_of("h.mul_(2.0)"))

    def test_a_division_by_zero(self):
        # It was a Python ZeroDivisionError with a traceback.
        self.refused(f"{MODULES}:divide_by_zero", "division by the constant 0",
                     line_of("x = self.logits(tokens) / 0.0"))

    def test_a_frozen_parameter_becomes_a_constant(self):
        # A parameter with requires_grad False was exported as a trained `param`: sluice trained
        # what PyTorch keeps fixed.
        result, out = self.export(f"{MODULES}:frozen")
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(out, "model.sluice")) as f:
            program = f.read()
        self.assertIn("const %embed.weight: f32[11, 8] = loaded", program)
        self.assertNotIn("param %embed.weight", program)
        self.assertIn("param %head.weight", program)
        self.assertIn("constants and buffers (never trained): embed.weight", result.stdout)

    def test_a_file_that_is_not_python(self):
        # importlib gives no loader for a name not ending in .py: it was an AttributeError
        # traceback.
        path = os.path.join(self.parent, "model.txt")
        with open(path, "w") as f:
            f.write("def tiny(): pass\n")
        self.refused(f"{path}:tiny", f"{path}: not a Python file")

    def test_out_where_no_folder_can_be_made(self):
        # Each was a Python traceback (FileExistsError, FileNotFoundError from mkdtemp).
        blocker = os.path.join(self.parent, "a_file")
        with open(blocker, "w") as f:
            f.write("mine")
        self.refused(f"{MODULES}:tiny", f"--out {blocker}/out: cannot create a folder in",
                     out=f"{blocker}/out")
        os.remove(blocker)
        self.refused(f"{MODULES}:tiny", "--out /proc/out: cannot create a folder in '/proc'",
                     out="/proc/out")
        self.assertFalse(any(n.startswith(".torch_export.") for n in os.listdir("/proc")))

    def test_sizes_past_sluices_limits(self):
        # --batch 100000000 traced the module at that batch for real (it ran out of time).
        for batch, seq in (("100000000", "6"), ("2", "100000")):
            result, _ = self.export(f"{MODULES}:tiny", batch=batch, seq=seq)
            self.assertEqual(result.returncode, 1, result.stderr)
            self.assertIn("--batch must be 1 to 16384 and --seq 3 to 16384", result.stderr)

    def test_out_is_an_existing_file(self):
        path = os.path.join(self.parent, "file")
        with open(path, "w") as f:
            f.write("mine")
        self.refused(f"{MODULES}:tiny", f"--out {path} is an existing file", out=path)
        with open(path) as f:
            self.assertEqual(f.read(), "mine")

    def test_out_is_a_folder_with_other_files(self):
        folder = os.path.join(self.parent, "full")
        os.mkdir(folder)
        with open(os.path.join(folder, "keep.txt"), "w") as f:
            f.write("mine")
        self.refused(f"{MODULES}:tiny", "is a folder that holds other files", out=folder)
        self.assertEqual(os.listdir(folder), ["keep.txt"])



class ArrayInput(ExportCase):
    """Modules whose forward reads arrays (--data, --input, --bind), and convolutions. Its own
    ctest entry (torch_export_arrays), so that each entry stays well within its time limit."""

    def blobs(self):
        """examples/classifier_data.py's arrays, features f32[64, 8] and label i64[64]."""
        path = os.path.join(self.parent, "blobs.safetensors")
        subprocess.run([sys.executable, os.path.join(ROOT, "examples", "classifier_data.py"), path,
                        "--examples", "64"], check=True, capture_output=True)
        return path

    def test_a_key_padding_mask_becomes_a_key_bias(self):
        """nn.TransformerEncoder's src_key_padding_mask (nn.MultiheadAttention: a -inf bias added
        by baddbmm to [B·H, T, T] scores), BERT's masked_fill(mask == 0, -inf) of [B, H, T, T]
        scores and its added (1 - mask) * -10000: attention_key_bias with the bias one row per
        sequence, no softmax."""
        data = os.path.join(self.parent, "padded.safetensors")
        subprocess.run([sys.executable, os.path.join(ROOT, "examples", "padded_text_data.py"),
                        data, "--examples", "16", "--seq", "12"], check=True, capture_output=True)
        for model, bias in (("encoder_classifier", "f32[2*B, 12]"),
                            ("bert_classifier", "f32[B, 12]"), ("bert_additive", "f32[B, 12]")):
            result, out = self.export(os.path.join(HERE, "torch_classifiers.py") + ":" + model,
                                      out=os.path.join(self.parent, model), seq=None,
                                      extra=["--data", data])
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(os.path.join(out, "model.sluice")) as f:
                text = f.read()
            fused = [line for line in text.splitlines() if "= attention_key_bias(" in line]
            self.assertEqual(len(fused), 2, model)
            key_bias = re.search(r"attention_key_bias\(%[^,]+, %[^,]+, %[^,]+, %([^)]+)\)",
                                 fused[0]).group(1)
            self.assertIn(f"%{key_bias}: {bias} = ", text, model)
            self.assertNotIn("softmax(", text)

    def test_a_classifier_reads_arrays_by_name(self):
        data = self.blobs()
        result, out = self.export(f"{MODULES}:classifier", seq=None,
                                  extra=["--data", data, "--bind", "x=features", "--bind", "y=label"])
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(out, "model.sluice")) as f:
            text = f.read()
        self.assertIn("input %x: f32[B, 8] = features", text)
        self.assertIn("input %y: i64[B] = label", text)
        self.assertIn(f"--data {data}", result.stdout)
        # the same types given on the command line instead of a data file
        result, out = self.export(f"{MODULES}:classifier", os.path.join(self.parent, "typed"),
                                  seq=None, extra=["--input", "x=f32[8]", "--input", "y=i64[]"])
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(out, "model.sluice")) as f:
            self.assertIn("input %x: f32[B, 8] = x", f.read())

    def test_array_inputs_that_do_not_fit(self):
        data = self.blobs()
        self.refused(f"{MODULES}:classifier", f"--data {data} has no array 'x' for forward "
                     f"argument 'x' (its arrays: features, label)", "--bind x=ARRAY",
                     seq=None, extra=["--data", data])
        self.refused(f"{MODULES}:classifier", "--bind z=features: forward has no argument "
                     "'z' (its arguments: x, y)", seq=None,
                     extra=["--data", data, "--bind", "z=features"])
        self.refused(f"{MODULES}:classifier", "--seq is for token models", extra=["--data", data])
        self.refused(f"{MODULES}:classifier", "no type for forward argument(s) y", seq=None,
                     extra=["--input", "x=f32[8]"])
        self.refused(f"{MODULES}:classifier", "--input x=f16[8]: expected ARGUMENT=TYPE",
                     seq=None, extra=["--input", "x=f16[8]", "--input", "y=i64[]"])
        self.refused(f"{MODULES}:tiny", "give --seq T for a token model", seq=None)

    def exported_text(self, spec, extra):
        out = os.path.join(self.parent, spec.rsplit(":", 1)[1])
        result, out = self.export(spec, out, seq=None, extra=extra)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(os.path.join(out, "model.sluice")) as f:
            return f.read()

    def test_grouped_dilated_and_transposed_convolutions_and_upsampling_export(self):
        images = ["--input", "x=f32[2, 8, 8]", "--input", "y=i64[]"]
        self.assertIn("= conv2d(%x, %layer.weight) {groups = 2, padding = [0, 0], stride = [1, 1]}",
                      self.exported_text(f"{MODULES}:grouped_conv", images))
        self.assertIn("{dilation = [2, 2], padding = [0, 0], stride = [1, 1]}",
                      self.exported_text(f"{MODULES}:dilated_conv", images))
        # Conv1d: rows of one pixel, the dilation and padding along the columns.
        text = self.exported_text(f"{MODULES}:dilated_depthwise_conv1d",
                                  ["--input", "x=f32[2, 8]", "--input", "y=i64[]"])
        self.assertIn("{dilation = [1, 2], groups = 2, padding = [0, 2], stride = [1, 1]}", text)
        # ConvTranspose2d: the input gradient of the convolution it transposes, at 16x16 (7 · 2
        # − 2 + 3 + output_padding 1).
        self.assertIn("f32[B, 4, 16, 16] = conv2d_grad_input(%x, %layer.weight) {height = 16, "
                      "padding = [1, 1], stride = [2, 2], width = 16}",
                      self.exported_text(f"{MODULES}:transposed_conv", images))
        self.assertIn("broadcast_to(%layer.upsample_nearest2d) {shape = [B, 2, 8, 2, 8, 2]}",
                      self.exported_text(f"{MODULES}:nearest_upsample", images))

    def test_convolution_options_sluice_lacks(self):
        images = ["--input", "x=f32[2, 8, 8]", "--input", "y=i64[]"]
        self.refused(f"{MODULES}:bilinear_upsample", "unsupported ATen op "
                     "aten.upsample_bilinear2d.vec", "in module 'layer'",
                     line_of("h = self.layer(x)"), seq=None, extra=images)
        self.refused(f"{MODULES}:fractional_upsample", "nearest upsampling from 8x8 to 12x12: "
                     "sluice repeats pixels by whole factors", "in module 'layer'", seq=None,
                     extra=images)
        self.refused(f"{MODULES}:batch_norm_cumulative", "module 'layer' is a batch norm with "
                     "momentum=None", "give one (PyTorch's default is 0.1)", seq=None,
                     extra=images)
        self.refused(f"{MODULES}:batch_norm_untracked", "module 'layer' is a batch norm with "
                     "track_running_stats=False", seq=None, extra=images)

    def test_batch_norm_keeps_its_running_statistics_in_buffers(self):
        # Batch norm was refused; now its running statistics are buffers that start as the factory
        # made them, although tracing runs forward (which moves them) three times.
        images = ["--input", "x=f32[2, 8, 8]", "--input", "y=i64[]"]
        result, out = self.export(f"{MODULES}:batch_norm", seq=None, extra=images)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("constants and buffers (never trained): layer.running_mean, "
                      "layer.running_var", result.stdout)
        with open(os.path.join(out, "model.sluice")) as f:
            text = f.read()
        self.assertIn("buffer %layer.running_mean: f32[2] = loaded", text)
        self.assertIn("batch_norm_update_stats(%x, %layer.running_mean, %layer.running_var) "
                      "{momentum = 0.1}", text)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gpt_reference import read_safetensors  # noqa: E402
        init, _ = read_safetensors(os.path.join(out, "init.safetensors"))
        self.assertEqual(init["layer.running_mean"].tolist(), [0.0, 0.0])
        self.assertEqual(init["layer.running_var"].tolist(), [1.0, 1.0])


class RecurrentForward(unittest.TestCase):
    """tools/torch_export/recurrent.py's unrolled forward against the layer's own (PyTorch's fused
    CPU kernels) on every configuration it maps: LSTM, GRU, RNN (tanh, relu); 1 and 2 layers;
    batch_first both ways; one and two directions; with and without biases; with and without an
    initial state; an unbatched input; LSTMs with projections (proj_size). Outputs, final states
    and every parameter's gradient of one loss that reads them all, within 1e-5 (the sums run in
    another order)."""

    def test_unrolled_forward_computes_what_the_layer_computes(self):
        import itertools
        import torch
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        from torch_export.recurrent import unrolled_forward
        torch.manual_seed(0)
        layers = [(torch.nn.LSTM, {}), (torch.nn.GRU, {}), (torch.nn.RNN, {}),
                  (torch.nn.RNN, {"nonlinearity": "relu"})]
        for (cls, extra), num, batch_first, bidi, bias, state in itertools.product(
                layers, (1, 2), (True, False), (False, True), (True, False), (False, True)):
            with self.subTest(layer=cls.__name__, extra=extra, num_layers=num,
                              batch_first=batch_first, bidirectional=bidi, bias=bias,
                              state=state):
                m = cls(5, 4, num_layers=num, batch_first=batch_first, bidirectional=bidi,
                        bias=bias, **extra)
                x = torch.randn(3, 6, 5) if batch_first else torch.randn(6, 3, 5)
                hx = None
                if state:
                    hx = torch.randn(num * (2 if bidi else 1), 3, 4)
                    if cls is torch.nn.LSTM:
                        hx = (hx, torch.randn_like(hx))
                self.assertClose(m, x, hx, m.forward, unrolled_forward(m, "m"))
        m = torch.nn.LSTM(5, 4, num_layers=2, bidirectional=True)
        self.assertClose(m, torch.randn(6, 5), None, m.forward, unrolled_forward(m, "m"))
        # An LSTM with projections (proj_size): h [.., 3] projected from the cell's 4.
        for bidi, state in itertools.product((False, True), (False, True)):
            with self.subTest(proj_size=3, bidirectional=bidi, state=state):
                m = torch.nn.LSTM(5, 4, num_layers=2, bidirectional=bidi, proj_size=3)
                d = 2 if bidi else 1
                hx = (torch.randn(2 * d, 2, 3), torch.randn(2 * d, 2, 4)) if state else None
                self.assertClose(m, torch.randn(6, 2, 5), hx, m.forward, unrolled_forward(m, "m"))

    def assertClose(self, module, x, hx, theirs, mine):
        import torch

        def run(forward):
            module.zero_grad()
            out, state = forward(x, hx)
            state = state if isinstance(state, tuple) else (state,)
            weights = torch.linspace(-1, 1, out.numel()).view(out.shape)
            loss = (out * weights).sum() + sum((s * s).sum() for s in state)
            loss.backward()
            return [out, *state] + [p.grad.clone() for p in module.parameters()]

        expected, got = run(theirs), run(mine)
        self.assertEqual(len(expected), len(got))
        for e, g in zip(expected, got):
            self.assertEqual(e.shape, g.shape)
            self.assertLess((e - g).abs().max().item(), 1e-5)


if __name__ == "__main__":
    try:
        import torch  # noqa: F401
    except ImportError:
        print("skipped: python3-torch is not installed (scripts/install-deps.sh installs it); "
              "tools/torch_export.py needs it")
        sys.exit(77)
    unittest.main()
