"""lopper.InferenceSession against ONNX Runtime on models PyTorch exported (the fixtures), and
its arguments, errors, threads, devices and outputs as ONNX Runtime's users expect them."""
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

import lopper
from conftest import assert_close

CUDA = torch.cuda.is_available()


def ort_session(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(model) if isinstance(model, Path) else model, so,
                                providers=["CPUExecutionProvider"])


def bert_feeds(batch, seq, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[-1, seq // 2:] = 0
    types = np.zeros((batch, seq), np.int64)
    types[:, seq // 2:] = 1
    return {"input_ids": rng.integers(0, 1000, (batch, seq), dtype=np.int64),
            "attention_mask": mask, "token_type_ids": types}


@pytest.fixture(scope="module")
def resnet(fixtures):
    path = fixtures / "resnet18.ts.onnx"
    x = np.load(fixtures / "resnet18.input_0.npy")
    return path, lopper.InferenceSession(path, threads=2), x


# --- outputs: ONNX Runtime's, in the kind they were fed ----------------------------------------


def test_resnet18_numpy_matches_onnxruntime(resnet):
    path, sess, x = resnet
    (want,) = ort_session(path).run(None, {"input": x})
    out = sess.run(None, {"input": x})
    assert isinstance(out, list) and len(out) == 1
    assert isinstance(out[0], np.ndarray)
    assert_close(out[0], want)


def test_torch_in_torch_out(resnet):
    path, sess, x = resnet
    (want,) = ort_session(path).run(None, {"input": x})
    (got,) = sess.run(None, {"input": torch.from_numpy(x)})
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and got.device.type == "cpu"
    assert_close(got.numpy(), want)
    # An ordinary tensor: torch's in-place ops and autograd take it (an inference tensor would not).
    assert not got.is_inference()
    got.add_(1)
    w = torch.ones(1000, requires_grad=True)
    (got * w).sum().backward()
    assert torch.equal(w.grad, got[0].detach())


def test_inputs_are_not_changed(resnet):
    _, sess, x = resnet
    keep = x.copy()
    t = torch.from_numpy(x.copy())
    sess.run(None, {"input": x})
    sess.run(None, {"input": t})
    assert np.array_equal(x, keep) and np.array_equal(t.numpy(), keep)


@pytest.mark.parametrize("batch,seq", [(3, 7), (1, 20)])
def test_dynamic_axes_int64_inputs(fixtures, batch, seq):
    path = fixtures / "bert_cls.dynamo.onnx"
    feeds = bert_feeds(batch, seq)
    (want,) = ort_session(path).run(None, feeds)
    sess = lopper.InferenceSession(str(path))
    (got,) = sess.run(None, feeds)
    assert got.shape == (batch, 3)
    assert_close(got, want)
    (got_t,) = sess.run(None, {k: torch.from_numpy(v) for k, v in feeds.items()})
    assert_close(got_t.numpy(), want)


def test_gpt2_matches_onnxruntime(fixtures):
    path = fixtures / "gpt2.dynamo.onnx"
    feeds = {"input_ids": np.load(fixtures / "gpt2.input_0.npy"),
             "attention_mask": np.load(fixtures / "gpt2.input_1.npy")}
    (want,) = ort_session(path).run(None, feeds)
    (got,) = lopper.InferenceSession(path).run(None, feeds)
    assert got.shape == (2, 16, 1000)
    assert_close(got, want)


def prune_matmul_weights(model, pattern):
    """The model with every MatMul weight (an initializer, [inputs, outputs]) pruned by magnitude:
    half of each output's weights ("50%"), or two of every four consecutive inputs ("2:4")."""
    import onnx
    from onnx import numpy_helper

    weights = {n.input[1] for n in model.graph.node if n.op_type == "MatMul"}
    pruned = 0
    for t in model.graph.initializer:
        if t.name not in weights:
            continue
        pruned += 1
        w = numpy_helper.to_array(t).copy()
        if pattern == "2:4":
            g = np.abs(w).reshape(w.shape[0] // 4, 4, w.shape[1])
            keep = np.argsort(g, axis=1)[:, 2:, :]
            mask = np.zeros_like(g, bool)
            np.put_along_axis(mask, keep, True, axis=1)
            w *= mask.reshape(w.shape)
        else:
            w[np.abs(w) < np.median(np.abs(w), axis=0, keepdims=True)] = 0
        t.CopyFrom(numpy_helper.from_array(w, t.name))
    onnx.checker.check_model(model)
    return pruned


@pytest.mark.parametrize("pattern", ["dense", "50%", "2:4"])
def test_llama_decode_step_matches_onnxruntime(fixtures, tmp_path, monkeypatch, pattern):
    """One decoding step of a LLaMA with its KV cache as inputs (ids [1, 1], position, past keys
    and values): the logits and every new key and value as ONNX Runtime's, on the dense step and
    with its MatMul weights pruned, run there by the bitmask kernel (forced: timing would choose
    ATen for weights this small)."""
    import onnx

    src = fixtures / "llama_decode.dynamo.onnx"
    names = [i.name for i in onnx.load(src).graph.input]
    feeds = {n: np.load(fixtures / f"llama_decode.input_{i}.npy") for i, n in enumerate(names)}
    path = src
    if pattern != "dense":
        m = onnx.load(src)
        assert prune_matmul_weights(m, pattern) == 15
        path = tmp_path / "step.onnx"
        onnx.save(m, path)
        monkeypatch.setenv("LOPPER_FORCE_KERNEL", "bitmask,bitmask-8of16")
        monkeypatch.setenv("LOPPER_KERNEL_CACHE", "off")
    want = ort_session(path).run(None, feeds)
    got = lopper.InferenceSession(path, threads=2).run(None, feeds)
    assert len(got) == len(want) == 5
    assert got[0].shape == (1, 1, 1000) and got[1].shape == (1, 2, 41, 16)
    for g, w in zip(got, want):
        assert_close(g, w)


def test_bytes_instead_of_a_path(resnet, multi_output_bytes):
    path, sess, x = resnet
    data = path.read_bytes()
    (want,) = sess.run(None, {"input": x})
    for src in (data, bytearray(data), memoryview(data)):
        (got,) = lopper.InferenceSession(src, threads=1).run(None, {"input": x})
        assert_close(got, want)
    x4 = np.arange(8, dtype=np.float32).reshape(2, 4) - 4
    got = lopper.InferenceSession(multi_output_bytes).run(["relu"], {"x": x4})
    assert np.array_equal(got[0], np.maximum(x4, 0))


def test_output_names_subset_and_order(multi_output_bytes):
    sess = lopper.InferenceSession(multi_output_bytes)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    relu, neg, twice, same, const = sess.run(None, {"x": x})
    assert np.array_equal(relu, np.maximum(x, 0)) and np.array_equal(neg, -x)
    assert np.array_equal(twice, x + x) and np.array_equal(same, x)
    assert np.array_equal(const, [1, 2, 3])
    got = sess.run(["twice", "relu"], {"x": x})
    assert len(got) == 2
    assert np.array_equal(got[0], x + x) and np.array_equal(got[1], np.maximum(x, 0))
    assert [a.shape for a in sess.run(("neg",), {"x": x})] == [(3, 4)]


def test_outputs_are_the_callers(multi_output_bytes):
    """Outputs never share memory with an input, an initializer or each other (ONNX Runtime's
    outputs are fresh), in numpy and in torch."""
    sess = lopper.InferenceSession(multi_output_bytes)
    x = np.ones((2, 4), np.float32)
    same, const = sess.run(["same", "const"], {"x": x})
    assert not np.shares_memory(same, x)
    same += 1
    const += 1
    assert np.array_equal(x, np.ones((2, 4)))
    assert np.array_equal(sess.run(["const"], {"x": x})[0], [1, 2, 3])
    a, b = sess.run(["relu", "relu"], {"x": x})
    assert not np.shares_memory(a, b)
    t = torch.ones(2, 4)
    same_t, const_t = sess.run(["same", "const"], {"x": t})
    assert same_t.data_ptr() != t.data_ptr()
    const_t.add_(1)
    assert torch.equal(sess.run(["const"], {"x": t})[0], torch.tensor([1.0, 2.0, 3.0]))


def test_strided_and_list_inputs(multi_output_bytes):
    sess = lopper.InferenceSession(multi_output_bytes)
    base = np.arange(24, dtype=np.float32).reshape(4, 6) - 12
    for x in (base[:, ::-1][:, :4], base[::2, 1:5], base.T.copy()[:3, :4]):
        (relu,) = sess.run(["relu"], {"x": x})
        assert np.array_equal(relu, np.maximum(x, 0))
    (neg,) = sess.run(["neg"], {"x": torch.from_numpy(base).t()[1:3, :4]})
    assert torch.equal(neg, -torch.from_numpy(base).t()[1:3, :4])
    # Anything numpy.asarray takes, with its dtype: a list of ints is int64, refused as ORT does.
    with pytest.raises(ValueError, match="expected float32, got int64"):
        sess.run(["twice"], {"x": [[1, 2, 3, 4]]})


# --- describing the model: ONNX Runtime's NodeArg ------------------------------------------------


@pytest.mark.parametrize("name", ["resnet18.ts", "bert_cls.dynamo", "gpt2.dynamo"])
def test_get_inputs_and_outputs_match_onnxruntime(fixtures, name):
    path = fixtures / f"{name}.onnx"
    ref, sess = ort_session(path), lopper.InferenceSession(path)
    pairs = [(sess.get_inputs(), ref.get_inputs()), (sess.get_outputs(), ref.get_outputs())]
    for got, want in pairs:
        assert [(a.name, a.type, a.shape) for a in got] == [(a.name, a.type, a.shape) for a in want]
    arg = sess.get_inputs()[0]
    assert isinstance(arg, lopper.NodeArg)
    assert repr(arg).startswith(f"NodeArg(name='{arg.name}', type='{arg.type}', shape=[")


# --- errors: lopper's one line as ValueError, TypeError or RuntimeError ---------------------------


def one_line(excinfo, *parts):
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    assert msg.startswith("["), msg
    for p in parts:
        assert p in msg, msg
    return msg


def test_bad_inputs_fail_with_lopper_line(resnet):
    """A feed that does not match the model's inputs is a bad argument (ValueError, as ONNX
    Runtime's InvalidArgument), with lopper's one line."""
    _, sess, x = resnet
    with pytest.raises(ValueError) as e:
        sess.run(None, {"image": x})
    one_line(e, "[run]", "no input named 'image'")
    with pytest.raises(ValueError) as e:
        sess.run(None, {"input": x, "image": x})
    one_line(e, "[run]", "no input named 'image'")
    with pytest.raises(ValueError) as e:
        sess.run(None, {"input": x.astype(np.float64)})
    one_line(e, "input 'input'", "float32", "float64")
    with pytest.raises(ValueError) as e:
        sess.run(None, {"input": x[0]})
    one_line(e, "input 'input'", "shape")
    with pytest.raises(ValueError) as e:
        sess.run(None, {"input": torch.from_numpy(x).double()})
    one_line(e, "input 'input'", "float32", "float64")
    with pytest.raises(ValueError) as e:
        sess.run(None, {})
    one_line(e, "missing input 'input'")
    # The session still runs after each refusal.
    (out,) = sess.run(None, {"input": x})
    assert out.shape[0] == x.shape[0]
    with pytest.raises(ValueError) as e:
        sess.run(["logits"], {"input": x})
    one_line(e, "no output named 'logits'")
    with pytest.raises(ValueError) as e:
        sess.run(None, {"input": x}, run_options=object())
    one_line(e, "run_options")


def test_bad_arguments_are_value_and_type_errors(resnet, multi_output_bytes):
    _, sess, x = resnet
    with pytest.raises(TypeError) as e:
        sess.run(None, [x])
    one_line(e, "input_feed must be a dict")
    with pytest.raises(TypeError) as e:
        sess.run("191", {"input": x})
    one_line(e, "output_names")
    with pytest.raises(TypeError) as e:
        sess.run(None, {0: x})
    one_line(e, "input names must be str")
    mixed = lopper.InferenceSession(multi_output_bytes)
    with pytest.raises(ValueError):
        # One input only, so mixing needs two feeds: the second name is unknown, but the mix is
        # found first.
        mixed.run(None, {"x": np.ones((1, 4), np.float32), "y": torch.ones(1, 4)})
    with pytest.raises(ValueError) as e:
        mixed.run(None, {"x": np.array([{"a": 1}], dtype=object)})
    one_line(e, "input 'x'")
    with pytest.raises(ValueError) as e:
        lopper.InferenceSession(multi_output_bytes, threads=-1)
    one_line(e, "threads must be 0..", "got -1")
    with pytest.raises(TypeError) as e:
        lopper.InferenceSession(3)
    one_line(e, "path_or_bytes")
    with pytest.raises(TypeError):
        lopper.InferenceSession(multi_output_bytes, "cpu")  # device and threads are keywords


def test_bad_files_and_bytes_fail_with_lopper_line(tmp_path, fixtures):
    with pytest.raises(RuntimeError) as e:
        lopper.InferenceSession(tmp_path / "nope.onnx")
    one_line(e, "nope.onnx")
    with pytest.raises(RuntimeError) as e:
        lopper.InferenceSession(b"this is not an ONNX model")
    one_line(e)
    data = (fixtures / "resnet18.ts.onnx").read_bytes()
    with pytest.raises(RuntimeError) as e:
        lopper.InferenceSession(data[: len(data) // 2])
    one_line(e)
    folder = tmp_path / "folder.onnx"
    folder.mkdir()
    with pytest.raises(RuntimeError) as e:
        lopper.InferenceSession(str(folder))
    one_line(e, "folder.onnx")


# --- threads, the GIL, devices -------------------------------------------------------------------

THREADS_PROBE = """
import os, sys, numpy as np, torch, lopper
torch.set_num_threads(1)
tasks = lambda: len(os.listdir('/proc/self/task'))
before = tasks()
sess = lopper.InferenceSession(sys.argv[1], threads=int(sys.argv[3]))
sess.run(None, {'input': np.load(sys.argv[2])})
print(sess.threads, torch.get_num_threads(), tasks() - before)
"""


def test_threads_are_honoured_and_put_back(resnet, fixtures):
    """In a fresh process (OpenMP's pool only grows): threads=1 starts no thread, threads=3 runs
    a team of 3 (2 new threads); torch's own count is 1 again after each."""
    path, _, _ = resnet
    got = {}
    for n in (1, 3):
        r = subprocess.run([sys.executable, "-c", THREADS_PROBE, str(path),
                            str(fixtures / "resnet18.input_0.npy"), str(n)],
                           capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert r.returncode == 0, r.stderr
        got[n] = [int(v) for v in r.stdout.split()]
    assert got[1] == [1, 1, 0]
    assert got[3][:2] == [3, 1] and got[3][2] >= 2, got[3]


def test_default_threads_follow_omp_num_threads(multi_output_bytes):
    code = "import lopper,sys; print(lopper.InferenceSession(sys.stdin.buffer.read()).threads)"
    r = subprocess.run([sys.executable, "-c", code], input=multi_output_bytes, capture_output=True,
                       env={**os.environ, "OMP_NUM_THREADS": "3"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().strip() == "3"


def test_run_releases_the_gil(fixtures):
    """Another Python thread keeps running while lopper works, and two threads can share a session
    (its runs take turns)."""
    path = fixtures / "resnet18.ts.onnx"
    sess = lopper.InferenceSession(path, threads=1)
    x = np.load(fixtures / "resnet18.input_0.npy")
    (want,) = sess.run(None, {"input": x})
    results, ticks = [], 0

    def work():
        for _ in range(5):
            results.append(sess.run(None, {"input": x})[0])

    worker = threading.Thread(target=work)
    worker.start()
    while worker.is_alive():
        ticks += 1
    worker.join()
    assert ticks > 1000, f"the main thread ran {ticks} loop iterations during run()"
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 20
    for r in results:
        assert_close(r, want)


def test_cuda_without_a_gpu_is_one_line(multi_output_bytes):
    if CUDA:
        pytest.skip("a GPU is present (test_cuda_matches_cpu runs instead)")
    with pytest.raises(RuntimeError) as e:
        lopper.InferenceSession(multi_output_bytes, device="cuda")
    one_line(e, "[device]", "cuda")


@pytest.mark.parametrize("device", ["tpu", "cuda:", "cuda:x", "cuda:1234", "CPU", ""])
def test_bad_device_is_a_value_error(multi_output_bytes, device):
    """A device lopper cannot parse is a bad argument; "cuda" without a GPU is not
    (test_cuda_without_a_gpu_is_one_line)."""
    with pytest.raises(ValueError) as e:
        lopper.InferenceSession(multi_output_bytes, device=device)
    one_line(e, "[device]", f"'{device}'")


def test_bf16_precision_computes_in_bf16(resnet):
    """precision="bf16" converts the weights once and computes in bfloat16: the output moves off
    fp32's by bf16's rounding, no more, and comes back float32 in the kind it was fed."""
    path, _, x = resnet
    (want,) = ort_session(path).run(None, {"input": x})
    sess = lopper.InferenceSession(path, threads=2, precision="bf16")
    for feed in (x, torch.from_numpy(x)):
        (got,) = sess.run(None, {"input": feed})
        got = np.asarray(got)
        assert got.dtype == np.float32
        rel = np.abs(got - want).max() / np.abs(want).max()
        assert 0 < rel < 5e-2, rel


def test_bad_precision_is_a_value_or_type_error(multi_output_bytes):
    with pytest.raises(ValueError) as e:
        lopper.InferenceSession(multi_output_bytes, precision="fp8")
    one_line(e, "bad precision 'fp8'")
    with pytest.raises(TypeError) as e:
        lopper.InferenceSession(multi_output_bytes, precision=16)
    one_line(e, "precision")
    if not CUDA:
        with pytest.raises(ValueError) as e:
            lopper.InferenceSession(multi_output_bytes, precision="fp16")
        one_line(e, "fp16 needs a CUDA device")


@pytest.mark.skipif(not CUDA, reason="no CUDA GPU")
def test_cuda_matches_cpu(resnet):
    path, sess, x = resnet
    (want,) = sess.run(None, {"input": x})
    gpu = lopper.InferenceSession(path, device="cuda")
    assert gpu.device == "cuda:0"
    (got,) = gpu.run(None, {"input": x})
    assert isinstance(got, np.ndarray)
    assert_close(got, want, rtol=1e-3)
    (got_t,) = gpu.run(None, {"input": torch.from_numpy(x).cuda()})
    assert got_t.is_cuda and not got_t.is_inference()
    assert_close(got_t.cpu().numpy(), want, rtol=1e-3)


# --- the package ----------------------------------------------------------------------------------


def test_public_names_have_docstrings():
    assert lopper.__doc__ and lopper.__version__
    for name in lopper.__all__:
        obj = getattr(lopper, name)
        if name.startswith("__"):
            continue
        assert obj.__doc__ and len(obj.__doc__) > 40, name
        for attr, member in getattr(obj, "__dict__", {}).items():  # a builtin function has none
            if not attr.startswith("_") or (attr == "__init__" and name == "InferenceSession"):
                assert getattr(member, "__doc__", None), f"{name}.{attr} has no docstring"
