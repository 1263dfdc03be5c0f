"""The pickle toolkit: everything pickleshard knows about the pickle format, in one place.

Opcode tables and the one "where does this opcode and its payload end" primitive; the walker,
the span rewrite, the audit and the memo-id guard built on it; the inert unpickler; the
external-memo resolver. Modules here read bytes they are given and never open a file.
Import from the submodules (``pickleshard.picklekit.externals``...).
"""
