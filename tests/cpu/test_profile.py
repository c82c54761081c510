"""The CPU profile: stand-ins only where the real package cannot import; refused where CUDA is."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


def _py(code: str, env=None, pythonpath: str | None = None):
    e = {**os.environ, **(env or {})}
    if pythonpath:
        e["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e, timeout=120
    )


def test_stand_ins_raise_not_implemented_and_hide_fallback_names():
    out = _py(
        """
        from eagle3_patches.cpu.stubs import install_stubs, is_stub
        install_stubs()
        import sgl_kernel, torchvision
        from torchvision.transforms import InterpolationMode
        assert is_stub(sgl_kernel) and is_stub(torchvision)
        try:
            sgl_kernel.build_tree_kernel_efficient(1, 2)
        except NotImplementedError as e:
            print("NIE", "CUDA kernel" in str(e))
        try:
            from sgl_kernel import scaled_fp4_quant
        except ImportError:
            print("absent")
        try:
            from sgl_kernel.scalar_type import scalar_types
        except ImportError:
            print("absent-submodule")
        from sgl_kernel.flash_attn import flash_attn_varlen_func
        try:
            flash_attn_varlen_func()
        except NotImplementedError:
            print("NIE-submodule")
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["NIE", "True", "absent", "absent-submodule", "NIE-submodule"]


def test_importlibs_cache_reset_works_with_the_stand_ins():
    """transformers resets the import caches before it loads a checkpoint's own code (the tiny Kimi-K2.5's image
    processor, tests/e2e/test_image_requests.py): every finder the profile adds must take the call."""
    out = _py(
        """
        import importlib
        from eagle3_patches.cpu.stubs import install_stubs
        install_stubs()
        importlib.invalidate_caches()
        print("reset")
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["reset"]


def test_a_real_install_is_never_shadowed(tmp_path):
    real = tmp_path / "sgl_kernel"
    real.mkdir()
    (real / "__init__.py").write_text("REAL = True\n")
    out = _py(
        """
        from eagle3_patches.cpu.stubs import install_stubs
        installed = install_stubs()
        import sgl_kernel
        print(getattr(sgl_kernel, "REAL", False), "sgl_kernel" in installed)
        """,
        pythonpath=str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]


def test_a_broken_real_install_gets_the_stand_in(tmp_path):
    broken = tmp_path / "sgl_kernel"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise OSError('libnvrtc.so.12: cannot open shared object file')\n")
    out = _py(
        """
        from eagle3_patches.cpu.stubs import install_stubs, is_stub
        install_stubs()
        import sgl_kernel
        print(is_stub(sgl_kernel))
        """,
        pythonpath=str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_refused_where_cuda_is_available_unless_forced(monkeypatch):
    from eagle3_patches import cpu

    monkeypatch.setattr(cpu, "_cuda_available", lambda: True)  # the hardware fact this machine lacks
    monkeypatch.delenv("EAGLE3_PATCHES_CPU_PROFILE", raising=False)
    with pytest.raises(RuntimeError, match="CUDA is available"):
        cpu.activate()


def test_profile_sets_the_environment_and_workarounds_in_a_fresh_process():
    out = _py(
        """
        import os
        from eagle3_patches import cpu
        cpu.activate()
        import sglang.srt.models.deepseek_common.attention_backend_handler as h
        handlers = h.AttentionBackendRegistry._handlers
        print(os.environ["SGLANG_USE_CPU_ENGINE"], os.environ["TORCHDYNAMO_DISABLE"], "torch_native" in handlers)
        print(sorted(n for n, s in cpu.get_registry().status().items() if s.state.value == "applied"))
        """
    )
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = out.stdout.strip().splitlines()[-2:]
    assert first.split() == ["1", "1", "True"]
    assert "cpu_torch_native_mla_dispatch" in second


@pytest.mark.parametrize(
    "cpus, ranks, expected",
    [([0, 1], 2, "0|1"), ([0, 1, 2, 3], 2, "0,1|2,3"), ([3, 2, 1, 0], 1, "0,1,2,3"), ([0], 2, "0|0")],
)
def test_tp_thread_binding_splits_the_cores(cpus, ranks, expected):
    from eagle3_patches.cpu.workarounds import split_cpus

    assert split_cpus(cpus, ranks) == expected


#: two modules of Triton kernels, as sglang has them: one reaches the language as ``tl``; its kernel calls
#: ``tl.sum``, a device function of Triton's own ``triton.language.standard``, whose globals name ``core`` only
KERNELS = """
import triton
import triton.language as tl


@triton.jit
def row_sums(x_ptr, out_ptr, N: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([N], dtype=tl.float32) + tl.load(x_ptr + row * N + tl.arange(0, N))
    tl.store(out_ptr + row, tl.sum(acc, axis=0))
"""


def test_triton_kernels_compute_the_same_with_the_language_patched_once_a_module(tmp_path):
    """Triton's interpreter patches ``triton.language`` at every launch and device-function call; the profile's
    ``cpu_triton_interpreter_patch_lang_once`` lets it do so once for each module of kernels.  Three launches of a
    kernel that calls one of Triton's own device functions compute what torch does, and the interpreter's patch ran
    once for each of the two modules (the kernel's, triton.language.standard's), not at every call."""
    (tmp_path / "kernels.py").write_text(KERNELS)
    out = _py(
        """
        from eagle3_patches import cpu
        cpu.activate()
        import torch
        import triton.runtime.interpreter as interpreter
        state = cpu.get_registry().status()["cpu_triton_interpreter_patch_lang_once"].state.value
        inner = interpreter._patch_lang.__closure__  # the profile's wrapper closes over triton's own function
        original = next(c.cell_contents for c in inner if callable(c.cell_contents))
        calls = []
        def counted(fn):
            calls.append(fn.__module__)
            original(fn)
        for c in inner:
            if c.cell_contents is original:
                c.cell_contents = counted
        import kernels
        x = torch.arange(24, dtype=torch.float32).reshape(3, 8)
        for _ in range(3):
            out = torch.empty(3)
            kernels.row_sums[(3,)](x, out, N=8)
            assert torch.equal(out, x.sum(dim=1)), (out, x.sum(dim=1))
        print(state, sorted(calls))
        """,
        pythonpath=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-3:] == ["applied", "['kernels',", "'triton.language.standard']"], out.stdout
