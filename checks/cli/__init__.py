"""The `kvspec` command line: ``main`` (the parser, `explain`, and the dispatch to every other command), ``budget``
(one answer's CPU-time budget), ``picture`` (the SVG block layout), ``keys_tool`` (`kvspec keys`), ``model_cmd``
(`kvspec model`). Add a command in ``main.build_parser`` and its module beside it; every error leaves through
``main._die`` (exit 2, one line naming the rule).
"""
