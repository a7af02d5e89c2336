"""The offline wing: the whole Pulumi program run under mocks that answer like AWS, its plan,
and what helm and kubectl render from it. Used by ``make demo`` and the tests; ``pulumi up``
never imports it (the program is ``components/``).

- ``stacks``: the stack files, dummy secrets, the example values a user sets themselves.
- ``mocks``: ``run_program`` and the AWS-like answers (example zones and offerings).
- ``recording``: what a run registered, and the secret masking.
- ``rendering``: the Helm releases and the kustomization rendered with the real tools.
- ``plan``: the printed plan and the YAML (``python -m offline --stack p5``).
"""
