"""The program and its file: the bytecode the compiler writes and the runtime executes
(``bytecode``), the artifact that holds it with the manifest and the weights (``artifact``), and
the manifest's schema (``manifest``), and the modes a program runs in (``mode``)."""
