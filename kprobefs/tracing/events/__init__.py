"""Event kinds: kprobe events (trace_kprobe) with their fetch programs (fetch) and
command parser (probe_parser; the fetch arguments and the grammar: probe_args), event
probes (trace_eprobe), synthetic events (synth), the dynamic-event commands
(trace_dynevent), the kernel's static events (trace_events, their print fmt:
print_fmt), the ftrace system's own records (ftrace_events) and trace_printk()'s
(trace_printk)."""
