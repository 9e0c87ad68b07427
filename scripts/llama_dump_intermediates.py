#!/usr/bin/env python3
"""Dump every tensor llama.cpp's CPU graph computes for one prompt (the parity debugging aid of
tests/test_parity_llamacpp.py): llama-cpp-python's low-level API with a ``cb_eval`` callback, the
context configured as scripts/make_goldens.py's (n_ctx 4096, n_batch 512, 2 threads, no flash
attention, F16 KV cache).

Usage: scripts/llama_dump_intermediates.py MODEL.gguf OUT.npz TOKEN,TOKEN,...

OUT.npz keys are ``f"{i:04d}|{name}|{op}|{src0}|{src1}|{ggml_type}"`` (graph order; F32/F16/I32
tensors as numpy arrays of shape ``ne[::-1]``) plus ``logits`` (the last row's). The ctypes
``ggml_tensor`` layout is ggml.h's of llama-cpp-python 0.3.36 (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS
64, GGML_MAX_SRC 10, GGML_MAX_NAME 64).
"""
import ctypes, sys
import numpy as np
import llama_cpp

GGML_MAX_DIMS, GGML_MAX_SRC = 4, 10


class T(ctypes.Structure):
    pass


T._fields_ = [
    ("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
    ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
    ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(T) * GGML_MAX_SRC), ("view_src", ctypes.POINTER(T)),
    ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
    ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8),
]

ggml = ctypes.CDLL(llama_cpp.__file__.rsplit("/", 1)[0] + "/lib/libggml-base.so")
ggml.ggml_op_desc.restype = ctypes.c_char_p
ggml.ggml_op_desc.argtypes = [ctypes.POINTER(T)]

out = {}
counter = [0]


def read(t: T) -> np.ndarray | None:
    ne = list(t.ne)
    nb = list(t.nb)
    if t.type == 0:
        dt, es = np.float32, 4
    elif t.type == 1:
        dt, es = np.float16, 2
    elif t.type == 26:  # I32
        dt, es = np.int32, 4
    else:
        return None
    n = ne[0] * ne[1] * ne[2] * ne[3]
    if n == 0 or not t.data:
        return None
    # strided view
    maxoff = sum((ne[i] - 1) * nb[i] for i in range(4)) + es
    buf = (ctypes.c_char * maxoff).from_address(t.data)
    arr = np.ndarray(shape=tuple(ne[::-1]), dtype=dt, buffer=buf, strides=tuple(nb[::-1]))
    return np.array(arr, dtype=np.float32 if dt != np.int32 else np.int32)


@ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)
def cb(tp, ask, ud):
    if ask:
        return True
    t = ctypes.cast(tp, ctypes.POINTER(T)).contents
    a = read(t)
    if a is not None:
        s0 = t.src[0].contents.name.decode() if t.src[0] else ""
        s1 = t.src[1].contents.name.decode() if t.src[1] else ""
        op = ggml.ggml_op_desc(ctypes.cast(tp, ctypes.POINTER(T))).decode()
        out[f"{counter[0]:04d}|{t.name.decode()}|{op}|{s0}|{s1}|{t.type}"] = a
        counter[0] += 1
    return True


def main():
    model_path, out_path, toks = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")]
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), mp)
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = 4096
    cp.n_batch = 512
    cp.n_ubatch = 512
    cp.n_threads = 2
    cp.n_threads_batch = 2
    cp.cb_eval = cb
    cp.cb_eval_user_data = None
    # llama-cpp-python's Llama default: flash_attn off (goldens were made through Llama()).
    if hasattr(cp, "flash_attn_type"):
        cp.flash_attn_type = 0
    elif hasattr(cp, "flash_attn"):
        cp.flash_attn = False
    ctx = llama_cpp.llama_init_from_model(model, cp)
    arr = (llama_cpp.llama_token * len(toks))(*toks)
    batch = llama_cpp.llama_batch_get_one(arr, len(toks))
    rc = llama_cpp.llama_decode(ctx, batch)
    assert rc == 0, rc
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)),)).copy()
    out["logits"] = logits
    np.savez(out_path, **out)
    print(len(out), "tensors")


main()
