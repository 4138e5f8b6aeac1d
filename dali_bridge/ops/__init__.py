"""Ops: one module holds everything about an op; :data:`OPS` names them.

An op (:class:`~dali_bridge.ops.base.Op`) declares, in its own module, its required core:

* its parameters, defaults and checks (:class:`Param`) — what the spec validator uses;
* ``draws`` (uniforms per sample) and ``sample``: how they become concrete per-sample parameters
  given the image size — pure numpy, torchvision's ``make_params`` driven by the bridge's
  counter-based uniforms (:func:`dali_bridge.pipeline.sampling.draws`);
* ``torchvision_kernel`` (``transforms.v2.functional`` on a CHW uint8 tensor, given the step's
  static parameters) and ``torchvision_transforms``, the ``transforms.v2`` transform it must match
  (parity tests and the hand-written bench baseline); ``discontinuous`` where its output jumps at
  a threshold (posterize, solarize, equalize), which the parity tests read;
* on a :class:`DaliOp` (:mod:`dali_bridge.ops.dali_op`): ``dali_columns`` (per-sample argument
  columns by name, dtype and shape), ``dali_arguments`` (the batch's columns by name) and
  ``dali_graph`` (its fragment, reading the columns by name). A per-sample op without it runs on
  the DALI backends as its torchvision kernel right after the graph.

What only some ops answer are optional facets with defaults (:mod:`dali_bridge.ops.facets`), read
through ``facet(op, Facet)``: ``Sizing`` (its effect on the size, the resize it asks for, the centre
it keeps, a crop window a decoder reads, a flip the finish takes), ``SpecRules`` (rules across
parameters, ``lower`` — the plan steps it becomes, ``crop_mirror_normalize`` → centre crop, flip,
finish — and a parameter-dependent draw count), ``Display`` (what ``dali-bridge show`` lists),
``Batching`` (a batched torch kernel) and ``DaliBaseline`` (the plain DALI of the bench baseline).

Parameter meanings and defaults follow torchvision's ``transforms.v2``; sizes are in pixels,
mean/std in [0, 1] units (the DALI finish multiplies by 255).

The plan
--------
:func:`dali_bridge.pipeline.plan.build_plan` lowers a spec to ``Plan.all_steps``, a tuple of op instances
(:class:`Step`: the op + resolved parameters), in this order:

1. per-sample ops on uint8 images (:class:`Category` ``geometry`` or ``pixel``): decoded, then each step in
   turn — in DataLoader workers on torchvision, in the DALI graph on DALI;
2. the finish (``normalize``; an implicit uint8 one when the spec has none): dtype, normalisation,
   layout — on the batch on torchvision, crop_mirror_normalize on DALI;
3. ops after normalisation (category ``after_finish``, per-sample on float tensors: ``random_erasing``),
   then at most one batch-level op (category ``batch``: ``mixup``, ``cutmix``, ``batch_mix``) last.
   ``Plan.steps`` stops at the finish, so no executor sees them: the loader's post-finish stage
   (:mod:`dali_bridge.loader.post_finish`) runs them on the whole finished batch on the loader's device,
   the same for every backend. Batch-level ops draw per batch, keyed by (seed, epoch, the batch's
   position in the rank's epoch, rank, position); their interface is
   :mod:`dali_bridge.ops.after_finish`.

A step's draws are ``uniforms(seed, epoch, indices, stream=position + 1, count=op.draws)`` where
``position`` is its place in ``Plan.all_steps``: adding an op to a pipeline never changes the draws
of the ops before it.

Adding an op
------------
1. Write ``dali_bridge/ops/<name>.py``: a subclass of :class:`DaliOp` (or of :class:`Op` for an op
   the DALI backends run in torch), with the facets it needs, its class attributes (``draws``,
   ``transform``) and methods, one instance built with the name, category, parameters and
   documentation, and ``REGISTERED = (that instance,)``.
2. Add ``"<name>"`` to ``_MODULES`` in :mod:`dali_bridge.ops.registry`.
3. Add its row to the op table of ``README.md``.
4. Regenerate ``docs/pipeline-reference.md`` (``python -m dali_bridge.spec.reference --write
   docs/pipeline-reference.md``); an op without a plain DALI counterpart is named in
   ``docs/performance.md``.
5. Write ``tests/ops/test_<name>.py``: equivalence with torchvision on ``dali-cpu`` (within 1 level),
   the sampler's rate against torchvision's own transform (within 3 sigma), and add the op to a
   pipeline of ``tests/backends/dali/test_plan.py``'s ``PIPELINES`` (the GPU graph equals the CPU graph). The
   every-op tests of ``tests/ops/test_ops.py`` check it without being told of it.

``vertical_flip`` (torchvision's ``RandomVerticalFlip``) and ``random_grayscale``
(``RandomGrayscale``) are the worked examples; ``docs/adding-an-op.md`` shows the first whole.
Nothing in the loader, the executors or the spec validator changes. Another package registers
its ops without steps 2 to 4: an entry point of the group ``dali_bridge.ops`` per op, named after it
and pointing at its instance (:mod:`dali_bridge.ops.registry`).

Pure Python at import time: no DALI or torch import, so the spec layer can validate anywhere.
"""
from __future__ import annotations
