"""Tracers, what ``current_tracer`` names: the plugin interface and nop (plugin),
function and the stack tracer (function) with set_ftrace_filter's commands
(ftrace_probes), function_graph (function_graph records, function_graph_output prints),
the function profiler (function_profile), the latency tracers (latency_tracers) and the
latency format they print in (latency_format)."""
