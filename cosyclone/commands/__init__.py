"""The command-line commands that run the engine or check its inputs: ``synth``, ``say``, ``validate``,
``inspect`` and ``make-tiny-model``, one module each (``cosyclone/cli.py`` registers them with the
commands that live with their packages: ``eval``, ``export``, ``report``, ``trace``).

Each command declares only its positional arguments; every option comes from the registry
(:mod:`cosyclone.options`, :mod:`cosyclone.commands.options`) through ``cli_options.with_options``.
"""
