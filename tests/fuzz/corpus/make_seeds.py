#!/usr/bin/env python3
"""make_seeds.py -- writes the checked-in seed corpus of the fuzz targets (tests/fuzz/corpus/).

    python3 tests/fuzz/corpus/make_seeds.py [BUILD_FUZZ_DIR]     (default build-fuzz)

safetensors/ and scenario/ are plain Python. golden_reader/ holds edit programs
(tests/fuzz/golden_edits.hpp): their dataset / attribute picks are indices into the bases'
inventories, which `fuzz_golden_reader` prints with K4_FUZZ_INVENTORY=1; hdf5_bytes/ holds the
small dumps `fuzz_hdf5_bytes` writes with K4_FUZZ_MAKE_SEEDS=DIR. Both binaries come from
BUILD_FUZZ_DIR (scripts/fuzz.sh build). The output is deterministic: rerun after changing
the bases or the edit format, and commit the result.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "..", "build-fuzz")


def reset(name):
    d = os.path.join(HERE, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    return d


def put(d, name, data):
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors ------------------------------------------------------------------------

def st(header, data=b"", hlen=None):
    h = header if isinstance(header, (bytes, str)) else json.dumps(header, separators=(",", ":"))
    if isinstance(h, str):
        h = h.encode()
    n = len(h) if hlen is None else hlen
    return struct.pack("<Q", n) + h + data


def safetensors():
    d = reset("safetensors")
    e = lambda dt, shape, a, b: {"dtype": dt, "shape": shape, "data_offsets": [a, b]}
    put(d, "valid_bf16", st({"x": e("BF16", [2, 3], 0, 12), "__metadata__": {"format": "pt"}}, bytes(range(12))))
    put(d, "valid_all_dtypes", st({
        "b": e("BOOL", [2], 0, 2), "u8": e("U8", [3], 2, 5), "i8": e("I8", [1], 5, 6),
        "f8": e("F8_E4M3", [2], 6, 8), "f8b": e("F8_E5M2", [1], 8, 9), "sc": e("F8_E8M0", [1], 9, 10),
        "i16": e("I16", [1], 10, 12), "u16": e("U16", [1], 12, 14), "f16": e("F16", [1], 14, 16),
        "i32": e("I32", [1], 16, 20), "u32": e("U32", [1], 20, 24), "f32": e("F32", [1], 24, 28),
        "f64": e("F64", [1], 28, 36), "i64": e("I64", [1], 36, 44), "u64": e("U64", [1], 44, 52)},
        bytes(52)))
    put(d, "valid_empty_and_scalar", st({"empty": e("F8_E4M3", [0, 4], 0, 0), "scalar": e("F32", [], 0, 4)}, bytes(4)))
    put(d, "valid_metadata_kinds", st({"__metadata__": {"s": "v", "n": 3, "o": {"a": [1]}}, "t": e("U8", [1], 0, 1)}, b"\x07"))
    put(d, "valid_hf_names", st({
        "model.layers.0.post_attention_layernorm.weight": e("BF16", [4], 0, 8),
        "model.layers.0.block_sparse_moe.gate.weight": e("BF16", [2, 4], 8, 24),
        "model.layers.0.block_sparse_moe.experts.0.w1.weight": e("U8", [2, 2], 24, 28)}, bytes(28)))
    put(d, "empty_file", b"")
    put(d, "short_length", b"\x05\x00\x00")
    put(d, "header_past_end", st({"x": e("U8", [1], 0, 1)}, b"\x00", hlen=4096))
    put(d, "header_huge", st("{}", b"", hlen=1 << 40))
    put(d, "not_json", st("{\"x\": [1, 2"))
    put(d, "json_array", st("[1, 2, 3]"))
    put(d, "entry_not_object", st({"x": 5}))
    put(d, "no_dtype", st({"x": {"shape": [1], "data_offsets": [0, 1]}}, b"\x00"))
    put(d, "unknown_dtype", st({"x": e("Q8", [1], 0, 1)}, b"\x00"))
    put(d, "negative_shape", st({"x": e("U8", [-1], 0, 1)}, b"\x00"))
    put(d, "float_shape", st({"x": e("U8", [1.5], 0, 1)}, b"\x00"))
    put(d, "offsets_reversed", st({"x": e("U8", [1], 1, 0)}, b"\x00"))
    put(d, "offsets_past_end", st({"x": e("U8", [4], 0, 4)}, b"\x00"))
    put(d, "offsets_negative", st({"x": e("U8", [1], -1, 0)}, b"\x00"))
    put(d, "size_mismatch", st({"x": e("F32", [2], 0, 4)}, bytes(4)))
    put(d, "big_shape", st({"x": e("U8", [4294967296, 4294967296], 0, 0)}))
    put(d, "metadata_not_object", st({"__metadata__": [1]}))
    put(d, "duplicate_keys", st('{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b"\x00\x01"))
    put(d, "unicode_name", st({"\u00e9\u4e2d": e("U8", [1], 0, 1)}, b"\x00"))
    put(d, "padded_header", st(json.dumps({"x": e("U8", [1], 0, 1)}) + "        ", b"\x01"))


# ---- scenario and config ----------------------------------------------------------------

TINY_CONFIG = {"name": "tiny", "heads": 16, "head_dim": 128, "hidden": 2048, "n_routed": 32, "top_k": 4, "inter": 128,
               "sparse_block": 128, "topk_blocks": 16, "page": 16, "n_split": 8, "max_tokens": 16,
               "max_context": 1048576, "kv_page_stride": 16, "static_kv_scale": False, "waves": 8, "lanes": 64,
               "o_rows": 32, "dn_rows": 32, "ug_rows": 16, "sh_rows": 8, "tp": 1, "sm_scale": 0.0883883461356163,
               "eps": 9.999999974752427e-07, "route_scale": 2.0, "shared_weight": 1.0, "swiglu_limit": 7.0,
               "init_blocks": 0, "local_blocks": 1, "wide_from": 5, "ag_rs_from": 12}


def scenario():
    d = reset("scenario")
    seeds = {
        "empty": "{}",
        "tokens4_short": '{"tokens": 4, "context": "short"}',
        "doc_example": '{"tokens": 6, "q_len": 2, "context": ["short", "medium", 5000], "pad_rows": [0],'
                       ' "static_kv_scale": false, "kv_page_stride": 16, "cache_blocks": 256,'
                       ' "inject": {"score_ties": true, "nan_scores": 1, "neg_zero_scores": 1, "inf_scores": 1,'
                       ' "repeated_expert": 3, "extreme_q": true, "huge_residual": true,'
                       ' "extreme_kv": true, "zero_rows": [2]}}',
        "test_roundtrip": '{"tokens": 6, "q_len": 2, "context": [100, "long", "short"], "pad_rows": [1],'
                          ' "kv_page_stride": 8, "inject": {"score_ties": true, "repeated_expert": true, "zero_rows": [0]}}',
        "one_a_row": '{"tokens": 3, "context": ["100", "2048", "2049"]}',
        "long_qlen2": '{"tokens": 4, "q_len": 2, "context": "long"}',
        "max": '{"tokens": 2, "context": "max", "cache_blocks": 8}',
        "static_kv": '{"tokens": 1, "context": 1, "static_kv_scale": true, "kv_page_stride": 8}',
        "pad_all": '{"tokens": 2, "context": 0, "pad_rows": [0, 1]}',
        "sixteen": '{"tokens": 16, "q_len": 4, "context": ["short", "medium", "long", 70000]}',
        "bad_unknown_key": '{"tokenz": 3}',
        "bad_inject_key": '{"inject": {"nan": 1}}',
        "bad_types": '{"tokens": "4", "context": [null], "inject": []}',
        "not_json": '{"tokens": ',
        "with_config": '{"tokens": 2, "context": 300}\x00' + json.dumps(TINY_CONFIG),
        "with_config_tp4": '{"tokens": 4, "context": "medium", "inject": {"repeated_expert": 5}}\x00' +
                           json.dumps(dict(TINY_CONFIG, tp=4, static_kv_scale=True)),
        "with_config_minimax": '{"tokens": 1}\x00' + json.dumps(dict(TINY_CONFIG, name="minimax-m3-tp4", hidden=6144,
                                                                     n_routed=128, inter=768, tp=4)),
        "config_missing_field": "{}\x00" + json.dumps({k: v for k, v in TINY_CONFIG.items() if k != "eps"}),
        "config_extra_field": "{}\x00" + json.dumps(dict(TINY_CONFIG, extra=1)),
        "config_bad_rule": "{}\x00" + json.dumps(dict(TINY_CONFIG, heads=8)),
    }
    for k, v in seeds.items():
        put(d, k, v)


# ---- golden_reader: edit programs -------------------------------------------------------

class Inv:
    def __init__(self):
        self.links, self.objects, self.datasets, self.attrs = [], [], [], []


def inventories():
    exe = os.path.join(BUILD, "fuzz_golden_reader")
    out = subprocess.run([exe], env=dict(os.environ, K4_FUZZ_INVENTORY="1", OMP_NUM_THREADS="1"),
                         capture_output=True, text=True, check=True).stdout
    bases = []
    for line in out.splitlines():
        w = line.split(" ")
        if w[0] == "base":
            bases.append(Inv())
        elif w[0] == "link":
            bases[-1].links.append(w[2])
        elif w[0] == "object":
            bases[-1].objects.append(w[2])
        elif w[0] == "dataset":
            bases[-1].datasets.append(w[2])
        elif w[0] == "attr":
            bases[-1].attrs.append((w[2], w[3]))
    return bases


ATTR_NAMES = ["magic", "schema_version", "contract_version", "tool_version", "config", "scenario", "seeds", "weights",
              "tp", "tokens", "kind", "q_len", "bt_width", "score_width", "rank", "kv_form", "n_pages",
              "n_stored_pages", "n_experts", "dtype", "dims", "meaning"]
STRING_VALUES = ["K4GOLDEN", "K4INPUTS", "whole", "selected", "dump", "bf16", "f32", "i32", "u8", "e4m3", "e8m0",
                 "e2m1x2", "", "token", "token,dim", "token,split,dim", "page,page_key", "one", "{}", "[]",
                 "{\"inputs_file\": \"x\"}", "1", "2", "K4GOLDEN\x01", "k4golden", "selected ", "f64", "x,y,z,w,v"]
CONFIG_FIELDS = list(TINY_CONFIG.keys())
TARGETS = ["/inputs/seq_lens", "/inputs/block_table", "/inputs/index_scores", "@/split/inputs/page_ids",
           "@/moe/inputs/expert_ids", "@/moe/outputs/route_ids", "@/index/outputs/sparse_table",
           "@/index/outputs/n_ctx", "@/index/outputs/blocks", "@/index/outputs/long_row", "@/router/outputs/key",
           "@/moe/outputs/route_weights", "@/split/inputs/k_scale", "@/moe/inputs/s13", "@/router/outputs/xsc"]


def u8(x): return struct.pack("<B", x & 0xFF)
def u16(x): return struct.pack("<H", x & 0xFFFF)
def val(v): return b"\xff" + struct.pack("<q", v)  # value(): a byte >= 224, then 8 raw bytes
def s(text, maxlen): return u8(len(text)) + text.encode("latin-1")


class Prog:
    def __init__(self, inv, base, flags):
        self.inv, self.b = inv, u8(base) + u8(flags)

    def delete_link(self, p): self.b += u8(0) + u16(self.inv.links.index(p)); return self
    def delete_attr(self, o, n): self.b += u8(1) + u16(self.inv.attrs.index((o, n))); return self

    def set_int(self, o, n, v):
        self.b += u8(2) + u16(self.inv.objects.index(o)) + u8(1) + u16(ATTR_NAMES.index(n)) + val(v); return self

    def set_str(self, o, n, v):
        self.b += u8(3) + u16(self.inv.objects.index(o)) + u8(1) + u16(ATTR_NAMES.index(n))
        self.b += (u8(1) + u16(STRING_VALUES.index(v))) if v in STRING_VALUES else (u8(0) + s(v, 40))
        return self

    def set_other(self, o, n, kind, extra=b""):
        self.b += u8(4) + u16(self.inv.objects.index(o)) + u8(1) + u16(ATTR_NAMES.index(n)) + u8(kind) + extra; return self

    def replace(self, p, attr_mode, typ, dims):  # dims: list of ("same"|"pm"|"val"|"small", arg)
        self.b += u8(5) + u16(self.inv.datasets.index(p)) + u8(attr_mode) + u8(typ) + u8(len(dims))
        for mode, arg in dims:
            self.b += {"same": lambda a: u8(0), "pm": lambda a: u8(1) + u8(a), "val": lambda a: u8(2) + val(a),
                       "small": lambda a: u8(3) + u8(a)}[mode](arg)
        if attr_mode & 2:
            self.b += u16(STRING_VALUES.index("bf16"))
        if attr_mode & 4:
            self.b += s("\x01\x02\x03", 64)
        return self

    def set_elems(self, p, mode, values):
        self.b += u8(6) + u16(self.inv.datasets.index(p)) + u8(mode | ((len(values) - 1) << 4))
        for v in values:
            self.b += val(v)
        return self

    def set_target(self, t, rank, mode, values):
        self.b += u8(8) + u16(TARGETS.index(t)) + (u8(rank) if t[0] == "@" else b"")
        self.b += u8(mode | ((len(values) - 1) << 4))
        for v in values:
            self.b += val(v)
        return self

    def config_int(self, field, v): self.b += u8(9) + u8(0) + u8(1) + u16(CONFIG_FIELDS.index(field)) + val(v); return self
    def config_erase(self, field): self.b += u8(9) + u8(3) + u8(1) + u16(CONFIG_FIELDS.index(field)); return self
    def config_preset(self, x): self.b += u8(9) + u8(4) + u8(1) + u16(0) + u8(x); return self
    def soft(self, p, mode, target=None):
        self.b += u8(10) + u16(self.inv.links.index(p)) + u8(mode)
        if mode == 0:
            self.b += u16(self.inv.links.index(target))
        elif mode in (1, 4):
            self.b += s(target or "", 24)
        return self

    def external(self, p, pristine): self.b += u8(11) + u16(self.inv.links.index(p)) + u8(1 if pristine else 0) + u8(1); return self
    def hard(self, p, src): self.b += u8(12) + u16(self.inv.links.index(p)) + u16(self.inv.objects.index(src)); return self
    def copy(self, src, rank): self.b += u8(13) + u16(self.inv.objects.index(src)) + u8(0) + u8(rank); return self
    def group(self, p): self.b += u8(14) + u16(self.inv.links.index(p)); return self
    def truncate(self, frac): self.b += u8(15) + u16(frac); return self


def golden_reader(bases):
    d = reset("golden_reader")
    g1, g2, d1, d2, i1 = bases
    n = 0

    def add(name, prog):
        nonlocal n
        put(d, "%02d_%s" % (n, name), prog.b)
        n += 1

    for base in range(5):
        for flags in range(8 if base < 4 else 1):
            add("base%d_flags%d" % (base, flags), Prog(bases[base], base, flags))
    r0s = "/rank0/split/inputs"
    add("tp1_n_pages_big", Prog(g1, 0, 0).set_int(r0s, "n_pages", 1 << 26))
    add("tp1_kv_form_selected", Prog(g1, 0, 0).set_str(r0s, "kv_form", "selected"))
    add("tp1_magic_inputs", Prog(g1, 0, 6).set_str("/", "magic", "K4INPUTS"))
    add("tp1_schema_2", Prog(g1, 0, 2).set_int("/", "schema_version", 2))
    add("tp1_tokens_str", Prog(g1, 0, 0).set_str("/", "tokens", "2"))
    add("tp1_tp_array", Prog(g1, 0, 0).set_other("/", "tp", 1, val(1) + val(2)))
    add("tp1_delete_h_in", Prog(g1, 0, 0).delete_link("/inputs/h_in"))
    add("tp1_delete_moe_group", Prog(g1, 0, 2).delete_link("/rank0/moe"))
    add("tp1_delete_dtype", Prog(g1, 0, 2).delete_attr("/rank0/merge/outputs/attn", "dtype"))
    add("tp1_replace_seq_lens_f32", Prog(g1, 0, 0).replace("/inputs/seq_lens", 1, 8, [("same", 0)]))
    add("tp1_replace_q_rank3", Prog(g1, 0, 2).replace("/rank0/split/inputs/q", 1, 2, [("same", 0), ("same", 0), ("small", 1)]))
    add("tp1_replace_attn_big", Prog(g1, 0, 2).replace("/rank0/merge/outputs/attn", 1, 2, [("val", 1 << 30), ("same", 0)]))
    add("tp1_seq_lens_max", Prog(g1, 0, 0).set_target("/inputs/seq_lens", 0, 0, [1 << 20]))
    add("tp1_block_table_neg", Prog(g1, 0, 0).set_target("/inputs/block_table", 0, 1, [-1]))
    add("tp1_route_ids_big", Prog(g1, 0, 3).set_target("@/moe/outputs/route_ids", 0, 0, [1000, -1]))
    add("tp1_expert_ids_unsorted", Prog(g1, 0, 0).set_target("@/moe/inputs/expert_ids", 0, 0, [31, 0]))
    add("tp1_sparse_table_page", Prog(g1, 0, 3).set_target("@/index/outputs/sparse_table", 0, 2, [1 << 20]))
    add("tp1_config_tp2", Prog(g1, 0, 0).config_int("tp", 2).set_int("/", "tp", 2).copy("/rank0", 1))
    add("tp1_config_hidden", Prog(g1, 0, 0).config_int("hidden", 4096))
    add("tp1_config_erase_eps", Prog(g1, 0, 2).config_erase("eps"))
    add("tp1_config_small", Prog(g1, 0, 0).config_preset(1))
    add("tp1_soft_cycle", Prog(g1, 0, 0).soft("/rank0/merge/inputs/o", 2))
    add("tp1_soft_other", Prog(g1, 0, 2).soft("/rank0/merge/inputs/o", 0, "/rank0/split/outputs/m"))
    add("tp1_soft_nowhere", Prog(g1, 0, 0).soft("/rank0/oproj/inputs/h_in", 1, "x"))
    add("tp1_external", Prog(g1, 0, 0).external("/rank0/oproj/inputs/w_o", True))
    add("tp1_hard_other", Prog(g1, 0, 0).hard("/rank0/split/inputs/k_cache", "/rank0/split/inputs/v_cache"))
    add("tp1_group_for_dataset", Prog(g1, 0, 0).group("/rank0/index/outputs/n_ctx"))
    add("tp1_truncate_half", Prog(g1, 0, 0).truncate(32768))
    r1s = "/rank1/split/inputs"
    add("tp2_page_ids_out", Prog(g2, 1, 0).set_target("@/split/inputs/page_ids", 1, 1, [1 << 30]))
    add("tp2_n_pages_small", Prog(g2, 1, 0).set_int(r1s, "n_pages", 1))
    add("tp2_n_stored_neg", Prog(g2, 1, 0).set_int(r1s, "n_stored_pages", -1))
    add("tp2_n_experts_zero", Prog(g2, 1, 0).set_int("/rank0/moe/inputs", "n_experts", 0))
    add("tp2_kv_form_whole", Prog(g2, 1, 0).set_str(r1s, "kv_form", "whole"))
    add("tp2_config_static_off", Prog(g2, 1, 0).config_int("static_kv_scale", 0))
    add("tp2_soft_s_o", Prog(g2, 1, 2).soft("/rank1/oproj/inputs/s_o", 0, "/rank0/router/inputs/bias"))
    add("tp2_replay_route", Prog(g2, 1, 3).set_target("@/moe/outputs/route_ids", 0, 3, [5, 6, 7]))
    add("dump1_seq_lens_replay", Prog(d1, 2, 1).replace("/rank0/index/outputs/n_ctx", 1, 4, [("same", 0)]))
    add("dump1_sparse_replay", Prog(d1, 2, 1).set_elems("/rank0/index/outputs/sparse_table", 0, [-5]))
    add("dump1_route_replay", Prog(d1, 2, 1).set_elems("/rank0/moe/outputs/route_ids", 0, [40, 33]))
    add("dump1_tokens_3", Prog(d1, 2, 0).set_int("/", "tokens", 3))
    add("dump1_no_config", Prog(d1, 2, 0).delete_attr("/", "config"))
    add("dump1_x_scale_nan", Prog(d1, 2, 1).set_elems("/rank0/merge/outputs/x_scale", 0, [0x7FC00000]))
    add("dump2_gate_back", Prog(d2, 3, 1).copy("/rank1/moe/outputs/up", 1))
    add("inputs_n_pages_big", Prog(i1, 4, 0).set_int("/rank0/inputs", "n_pages", 1 << 40))
    add("inputs_magic_golden", Prog(i1, 4, 0).set_str("/", "magic", "K4GOLDEN"))
    add("inputs_delete_k_cache", Prog(i1, 4, 0).delete_link("/rank0/inputs/k_cache"))
    add("inputs_block_table_big", Prog(i1, 4, 0).set_elems("/inputs/block_table", 1, [1 << 30]))
    add("inputs_config_tp2", Prog(i1, 4, 0).config_int("tp", 2).set_int("/", "tp", 2))
    add("dump2_rank0_copy", Prog(d2, 3, 1).copy("/rank1", 0))


def hdf5_bytes():
    d = reset("hdf5_bytes")
    exe = os.path.join(BUILD, "fuzz_hdf5_bytes")
    with tempfile.TemporaryDirectory() as t:
        subprocess.run([exe], env=dict(os.environ, K4_FUZZ_MAKE_SEEDS=t, OMP_NUM_THREADS="1"), check=True,
                       capture_output=True)
        for name in sorted(os.listdir(t)):
            shutil.copy(os.path.join(t, name), os.path.join(d, name))


if __name__ == "__main__":
    safetensors()
    scenario()
    golden_reader(inventories())
    hdf5_bytes()
    total = 0
    for root, _, files in os.walk(HERE):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print("make_seeds.py: corpus written, %d bytes in all" % total)
