"""Bind-time graph rewrites: fusions applied to a NetDef before a workspace binds it.

Nets on disk (models, checkpoints) stay as written; the callers that bind a net (the
Predictor, `profile`, the trainer) rewrite it first unless told not to (`--no-fuse`,
`fuse: false`). Inference rules fold test-mode normalization into convolutions and fuse
ReLUs; training rules fuse forward ops whose gradients the registry knows, before the
backward pass is built. Every rule is a small named unit (rule.py) and reports when it fired.
After the rules, on a CPU with oneDNN, the layout plan (layout.py) keeps activations in
oneDNN's channel-blocked layout between convolutions (in training, their gradients too).
"""
from netrun.rewrite.apply import (MODES, RULES, Fired, Rewritten, bind_rewrite, layout_block,
                                  rewrite, rules, training_rewrite, with_train_net)

__all__ = ["MODES", "RULES", "Fired", "Rewritten", "bind_rewrite", "layout_block", "rewrite",
           "rules", "training_rewrite", "with_train_net"]
