"""The globals audit: :mod:`.files` (every global a pickle names), :mod:`.walk` (its opcode
walk), :mod:`.torchpayloads` (pickles inside torch payloads).
"""
