"""``python -m eagle3_patches.testing.text_only_launch <sglang.launch_server flags>``: sglang's own launcher with
the served model's multimodal side off (``ServerArgs.enable_multimodal=False``, which sglang's command line
cannot set: ``--enable-multimodal`` only turns it on).

For the tiny multimodal targets (:func:`eagle3_patches.testing.tiny_vl_models.lacks_its_processor`), which carry no
image processor.  The model class and its forward stay sglang's own; nothing of eagle3-patches is applied
here (the bootstrap or sglang's plugin entry point does that, as in any launch).
"""

from __future__ import annotations

import runpy


def _text_only() -> None:
    import sglang.srt.server_args as server_args

    if isinstance(vars(server_args.ServerArgs).get("enable_multimodal"), (bool, type(None))):
        # a dataclass default: the releases whose constructor resolves the flags read it there
        server_args.ServerArgs.enable_multimodal = False
    from_cli_args = vars(server_args.ServerArgs)["from_cli_args"].__func__

    def text_only_from_cli_args(cls, args):
        # the parsed flags themselves (0.5.17 - 0.5.18: the constructor resolves from them, and a resolved
        # ServerArgs refuses a later write)
        args.enable_multimodal = False
        return from_cli_args(cls, args)

    server_args.ServerArgs.from_cli_args = classmethod(text_only_from_cli_args)
    parse = server_args.prepare_server_args

    def prepare_server_args(argv):
        parsed = parse(argv)
        if parsed.enable_multimodal is not False:  # releases that resolve later (ServerArgs.resolve_once)
            parsed.enable_multimodal = False
        return parsed

    server_args.prepare_server_args = prepare_server_args  # sglang.launch_server imports it by name below


if __name__ == "__main__":
    _text_only()
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
