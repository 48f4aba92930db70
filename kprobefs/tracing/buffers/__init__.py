"""Ring buffers and what reads and fills them: the per-CPU buffers (ring_buffer), their
binary pages (raw_page), the host side of the kernel's recorder (native), the text of
trace and trace_pipe (output, its steps made in bulk in batch and the texts it keeps
from one read to the next in text_caches; under options/raw, hex and bin: raw_output),
trace_marker_raw (marker), the snapshot buffer (snapshot) and the trace clocks
(clocks)."""
