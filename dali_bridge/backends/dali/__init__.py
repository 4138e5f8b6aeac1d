"""The DALI executor (``dali`` and ``dali-cpu``): one graph builder for both devices (``plan``), the
feeder that hands each batch's bytes and draws to the graph (``feed``), the executor that runs it
(``executor``), the graph's outputs as torch reads them (``outputs``), and the torch tail for the ops
DALI runs in torch (``tail``; where it runs: ``tail_runner``, ``tail_processes``)."""
