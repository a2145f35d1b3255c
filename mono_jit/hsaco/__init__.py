"""What an AMDGPU code object says (ELF header, metadata, kernel info, ISA) and the gates on it
(resources)."""
