"""``cosyclone trace``: one row replayed eagerly, step by step and layer by layer, to find where its
numbers broke.

Why apart from the engine: a trace reads every logit and every layer's output, which no run may pay
for. The replay calls the same stage functions as a run (the frontend's prepare, the talker's
generate with its in-step sampler, token2wav) and watches them through forward hooks that exist only
while the replay runs (:mod:`.probes`); nothing in the synthesis path knows a trace exists.

``source`` what made the row (its record and run, or a manifest line) · ``probes`` the hooks ·
``replay`` one row through the stages with the probes attached · ``verdict`` reproduced or not, the
first non-finite step and layer, what it touched, where two replays diverge · ``output`` the JSONL
and the terminal table · ``command`` the typer command.
"""
