/* The static events (CREATE_TRACE_POINTS): each include/trace/events header read once more for
 * each thing Linux builds from a TRACE_EVENT -- the record's struct, its fields' table,
 * the print format, the probe and the event's state.  See include/tracepoint.h. */
#include "tracepoint.h"
#include "trace_native.h"
#include "trace/all_events.h"		/* the declarations: trace_NAME() */

/* Held across the event control operations (6.1's trace_events.c): the host's tracer
 * serves them, and hostfs takes this for their opens, reads and writes. */
DEFINE_MUTEX(event_mutex);

#define TRACE_HEADER_MULTI_READ
#define __stringify_1(x...) #x
#define __stringify(x...) __stringify_1(x)

/* ---- 1: struct trace_event_raw_CLASS ------------------------------------------------- */
#undef DECLARE_EVENT_CLASS
#undef DEFINE_EVENT
#define TP_STRUCT__entry(args...) args
#define __field(type, item) type item;
#define __array(type, item, len) type item[len];
#define __string(item, src) u32 __data_loc_##item;
#define DECLARE_EVENT_CLASS(name, proto, args, tstruct, assign, print)	\
	struct trace_event_raw_##name {						\
		struct trace_entry ent;						\
		tstruct								\
		char __data[];							\
	};
#define DEFINE_EVENT(template, name, proto, args)
#include "trace/all_events.h"

/* ---- 2: the fields and the print format of each class ------------------------------ */
#undef __field
#undef __array
#undef __string
#undef DECLARE_EVENT_CLASS
#define is_signed_type(type) (((type)(-1)) < (type)1)
#define __field(_type, _item) { .type = #_type, .name = #_item, .size = sizeof(_type),	\
	.align = __alignof__(_type), .is_signed = is_signed_type(_type) },
#define __array(_type, _item, _len) { .type = #_type "[" __stringify(_len) "]",	\
	.name = #_item, .size = sizeof(_type[_len]), .align = __alignof__(_type),	\
	.is_signed = is_signed_type(_type), .len = _len },
#define __string(_item, _src) { .type = "__data_loc char[]", .name = #_item, .size = 4,	\
	.align = 4, .is_signed = is_signed_type(char) },
#define __entry REC
#define TP_printk(fmt, args...) #fmt ", " __stringify(args)
#define DECLARE_EVENT_CLASS(name, proto, args, tstruct, assign, print)	\
	static const struct trace_event_field trace_event_fields_##name[] = {	\
		tstruct { }	/* ends the table: a NULL name */ \
	};									\
	static const char print_fmt_##name[] = print;
#include "trace/all_events.h"

/* ---- 3: where each __string's bytes go (6.1's trace_event_get_offsets) ------------- */
#undef __field
#undef __array
#undef __string
#undef __entry
#undef TP_printk
#undef DECLARE_EVENT_CLASS
#define __field(type, item)
#define __array(type, item, len)
#define __string(item, src) u32 item;
#define DECLARE_EVENT_CLASS(name, proto, args, tstruct, assign, print)	\
	struct trace_event_data_offsets_##name { u32 __none; tstruct };
#include "trace/all_events.h"

#undef __string
#undef DECLARE_EVENT_CLASS
#define __trace_str(src) ((src) ? (const char *)(src) : "(null)")
#define __string(item, src)							\
	__data_offsets->item = (__data_size + offsetof(__raw_t, __data)) |	\
			       (u32)(strlen(__trace_str(src)) + 1) << 16;	\
	__data_size += strlen(__trace_str(src)) + 1;
#define DECLARE_EVENT_CLASS(name, proto, args, tstruct, assign, print)	\
	static __always_inline u32 trace_event_get_offsets_##name(		\
		struct trace_event_data_offsets_##name *__data_offsets, proto)	\
	{									\
		typedef struct trace_event_raw_##name __raw_t;			\
		u32 __data_size = 0;						\
										\
		(void)sizeof(__raw_t);		/* no __string: unused */	\
		tstruct								\
		return __data_size;						\
	}
#include "trace/all_events.h"

/* ---- 4: the probes ---------------------------------------------------------------- */
#undef __string
#undef DECLARE_EVENT_CLASS
#define __string(item, src) entry->__data_loc_##item = __data_offsets.item;
#define __entry entry
#define __get_str(field) ((char *)__entry + (__entry->__data_loc_##field & 0xffff))
#define __assign_str(dst, src)						\
	memcpy(__get_str(dst), __trace_str(src), __entry->__data_loc_##dst >> 16)
#define TP_fast_assign(args...) args
#define DECLARE_EVENT_CLASS(name, proto, args, tstruct, assign, print)	\
	static noinline void do_trace_event_raw_event_##name(	\
		struct trace_native_probe *tp, proto)				\
	{									\
		struct trace_event_data_offsets_##name __data_offsets;	\
		struct trace_event_raw_##name *entry;				\
		struct trace_event_buffer fbuffer;				\
		u32 __data_size;						\
										\
		if (!(READ_ONCE(tp->flags) & (TNP_RECORD | TNP_HOST))) {	\
			tp->nhit++;	/* no record: the strings go unmeasured */ \
			return;							\
		}								\
		__data_size = trace_event_get_offsets_##name(&__data_offsets, args); \
		entry = trace_event_buffer_reserve(&fbuffer, tp,		\
						   sizeof(*entry) + __data_size); \
		if (!entry)							\
			return;							\
		tstruct								\
		{ assign }							\
		trace_event_buffer_commit(&fbuffer);				\
	}
#include "trace/all_events.h"

/* ---- 5: each event's key, state and description ------------------------------------ */
#undef DECLARE_EVENT_CLASS
#undef DEFINE_EVENT
#define DECLARE_EVENT_CLASS(name, proto, args, tstruct, assign, print)
#define DEFINE_EVENT(template, call, proto, args)				\
	struct static_key __tracepoint_##call;					\
	static struct trace_native_probe event_tp_##call;			\
	void trace_event_raw_event_##call(proto)			\
	{									\
		do_trace_event_raw_event_##template(&event_tp_##call, args);	\
	}									\
	static const struct trace_event_call __used				\
	__section("__trace_events") __aligned(8) event_##call = {		\
		.system = __stringify(TRACE_SYSTEM),				\
		.name = #call,							\
		.print_fmt = print_fmt_##template,				\
		.fields = trace_event_fields_##template,			\
		.size = sizeof(struct trace_event_raw_##template),		\
		.key = &__tracepoint_##call,					\
		.tp = &event_tp_##call,						\
	};
#include "trace/all_events.h"
