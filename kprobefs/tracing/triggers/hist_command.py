"""Parsing hist trigger commands (event_hist_trigger_parse and create_hist_data of
kernel/trace/trace_events_hist.c): the attributes, the key/value/variable fields and
their expressions, sort keys, actions and field-variable histograms, then registering,
updating (pause/cont/clear), sharing (``name=``) or removing the trigger.

The text is read the way 6.1 reads it (``strsep`` on ``:`` and ``,``, the root
operator of an expression found by position) rather than with a grammar, because the
error_log caret and the accepted quirks follow from that reading.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field

from kprobefs.tracing.triggers.hist import (
    ALIAS, BUCKET, CONST, CPU, EXECNAME, EXPR, GRAPH, HEX, KEY, LOG2, PERCENT, STACKTRACE,
    STRING, SYM, SYM_OFFSET, SYSCALL, TIMESTAMP, USECS, VAR, VAR_REF, HistData, HistError,
    HistField, HistTrigger, _Action, _event_fields, _fail, _field_reader, _log2,
    _own_var, _U64, HIST_ERRORS,
)
from kprobefs.tracing.triggers.trigger import (
    EventTriggers, _kstrtoul, compile_trigger_filter,
)

__all__ = ["parse_hist_command"]

_BITS_MIN, _BITS_MAX = 7, 17
_KEYS_MAX, _VALS_MAX, _VARS_MAX, _SORT_KEYS_MAX = 3, 3, 16, 2
_STACK_DEPTH = 16
_ACTIONS_MAX = 8
_PARAMS_MAX = 64
#: Modifiers that are one word (".sym-offset" reads as "symXoffset" by then).
_MODIFIERS = {"hex": HEX, "sym": SYM, "symXoffset": SYM_OFFSET, "syscall": SYSCALL,
              "log2": LOG2, "usecs": USECS}

@dataclass
class _Attrs:
    keys: str | None = None
    vals: str | None = None
    sort: str | None = None
    name: str | None = None
    clock: str = "global"
    map_bits: int = 0
    assignments: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    pause: bool = False
    cont: bool = False
    clear: bool = False


def _parse_attrs(param: str) -> _Attrs:
    attrs = _Attrs()
    for part in param.split(":"):
        eq = part.find("=")
        if eq >= 0:
            if not part[eq + 1:]:
                _fail("EMPTY_ASSIGNMENT", part)
            for prefix in ("keys=", "key="):
                if part.startswith(prefix):
                    attrs.keys = part[len(prefix):]
                    break
            else:
                if part.startswith(("vals=", "val=", "values=")):
                    attrs.vals = part[eq + 1:]
                elif part.startswith("sort="):
                    attrs.sort = part[5:]
                elif part.startswith("name="):
                    attrs.name = part
                elif part.startswith("clock="):
                    attrs.clock = part[6:].strip(" \t\n")
                elif part.startswith("size="):
                    size = _kstrtoul(part[5:])
                    if size is None:
                        _fail(None)
                    bits = max(size - 1, 0).bit_length()
                    if not _BITS_MIN <= bits <= _BITS_MAX:
                        _fail(None)
                    attrs.map_bits = bits
                else:
                    if len(attrs.assignments) == _VARS_MAX:
                        _fail("TOO_MANY_VARS", part)
                    attrs.assignments.append(part)
        elif part == "pause":
            attrs.pause = True
        elif part in ("cont", "continue"):
            attrs.cont = True
        elif part == "clear":
            attrs.clear = True
        elif part.startswith(("onmatch(", "onmax(", "onchange(")) and \
                len(attrs.actions) < _ACTIONS_MAX:
            attrs.actions.append(part)
        else:
            _fail(None)
    if attrs.keys is None:
        _fail(None)
    return attrs


class _Builder:
    """Turns attrs into a HistData's fields (create_hist_data)."""

    def __init__(self, data: HistData, remove: bool):
        self.data = data
        self.triggers = data.triggers
        self.event_fields = _event_fields(data.triggers)
        self.remove = remove

    # ---------------------------------------------------------- atoms
    def parse_field(self, text: str, flags: int) -> HistField:
        name, dot, modifier = text.partition(".")
        buckets = 0
        if dot:
            if modifier in _MODIFIERS:
                flags |= _MODIFIERS[modifier]
            elif modifier == "execname" and name == "common_pid":
                flags |= EXECNAME
            elif modifier.startswith("bucket"):
                rest = modifier[6:]
                if rest.startswith("s"):
                    rest = rest[1:]
                value = _kstrtoul(rest[1:]) if rest.startswith("=") else None
                if not value:
                    _fail("BAD_FIELD_MODIFIER", modifier)
                buckets = value
                flags |= BUCKET
            elif modifier.startswith("percent") and not flags & (VAR | KEY):
                flags |= PERCENT
            elif modifier.startswith("graph") and not flags & (VAR | KEY):
                flags |= GRAPH
            else:
                _fail("BAD_FIELD_MODIFIER", modifier)
        if name == "common_timestamp":
            flags |= TIMESTAMP
            self.data.enable_timestamps = True
            usecs = bool(flags & USECS)

            def read_ts(rec, hit, refs):
                return (hit.ts + 500) // 1000 if usecs else hit.ts    # ns2usecs rounds
            return HistField("common_timestamp", flags, read_ts)
        if name in ("common_cpu", "cpu", "CPU"):
            return HistField("common_cpu", flags | CPU, lambda rec, hit, refs: hit.cpu, 4,
                             True)
        rf = self.event_fields.get(name)
        if rf is None:
            _fail("FIELD_NOT_FOUND", name)
        read, size, signed, is_string = _field_reader(rf)
        if is_string:
            flags |= STRING
        hf = HistField(name, flags, read, size, signed, buckets=buckets)
        if flags & LOG2:
            hf.read = lambda rec, hit, refs, _r=read: _log2(_r(rec, hit, refs))
        elif flags & BUCKET:
            hf.read = lambda rec, hit, refs, _r=read, _b=buckets: _r(rec, hit, refs) // _b * _b
        return hf

    def parse_atom(self, text: str, flags: int, var_name: str | None) -> HistField:
        if text[:1].isdigit():
            value = _kstrtoul(text)
            if value is None:
                _fail(None)
            return HistField("", CONST, lambda rec, hit, refs, _v=value: _v,
                             constant=value, var_name=var_name)
        system = event = None
        ref_var = text
        if text.count(".") >= 2:
            system, event, ref_var = text.split(".", 2)
        if ref_var.startswith("$"):
            return self.parse_var_ref(system, event, ref_var[1:], var_name)
        hf = self.parse_field(ref_var if system is None else text, flags)
        hf.var_name = var_name
        return hf

    def parse_var_ref(self, system, event, name, var_name) -> HistField:
        data = self.find_var(system, event, name)
        if data is None:
            _fail("VAR_NOT_FOUND", name)
        var = next(v for v in data.vars if v.var_name == name)
        shown = f"{system}.{event}.{name}" if system is not None else name
        ref = HistField(shown, VAR_REF | (var.flags & (USECS | TIMESTAMP | STRING)),
                        None, var.size, var.is_signed, ref=(data, name))
        ref.read = lambda rec, hit, refs, _f=ref: refs.value(_f)
        self.data.var_refs.append(ref)
        if var_name:
            alias = HistField(shown, ALIAS | (ref.flags & ~VAR_REF), ref.read, ref.size,
                              ref.is_signed, var_name=var_name, operands=(ref,))
            return alias
        return ref

    def _var_on_event(self, name: str) -> bool:
        """Whether a hist trigger of this event already defines ``name``."""
        return any(isinstance(t, HistTrigger) and any(v.var_name == name for v in t.data.vars)
                   for t in self.triggers.items)

    def find_var(self, system, event, name) -> HistData | None:
        """The histogram defining variable ``name``: this one, one on this event, the
        event of an ``onmatch()``, then any event — where two events define it, only
        ``SYS.EVENT.$name`` can tell them apart (VAR_NOT_UNIQUE)."""
        for v in self.data.vars:
            if v.var_name == name:
                return self.data
        host = self.triggers.host
        if system is not None:
            target = host.find_event(system, event)
            return _var_in(host.event_triggers(target), name) if target is not None \
                else None
        found = _var_in(self.triggers, name)
        if found is not None:
            return found
        for match in self.data.attrs.actions:
            if match.startswith("onmatch("):
                sys_event = match[len("onmatch("):].split(")", 1)[0]
                target = host.find_event(*sys_event.partition(".")[::2])
                found = _var_in(host.event_triggers(target), name) if target else None
                if found is not None:
                    return found
        hits = [d for d in (_var_in(pool, name) for pool in host.all_triggers()
                            if pool is not self.triggers) if d is not None]
        if len(hits) > 1:
            _fail("VAR_NOT_UNIQUE", name)
        return hits[0] if hits else None

    # ---------------------------------------------------------- expressions
    def parse_expr(self, text: str, flags: int, var_name: str | None,
                   depth: list) -> HistField:
        if depth[0] > 3:
            _fail("TOO_MANY_SUBEXPR", text)
        op, pos = _contains_operator(text)
        if op is None:
            return self.parse_atom(text, flags, var_name)
        if op == "neg":
            return self.parse_unary(text, flags, var_name, depth)
        depth[0] += 1
        left, right = text[:pos], text[pos + 1:]
        if not left or not right:
            _fail(None)
        op1 = self.parse_expr(left, 0, None, depth)
        if op1.is_string:
            _fail("INVALID_STR_OPERAND", left)
        op2 = self.parse_expr(right, 0, None, depth)
        if op2.is_string:
            _fail("INVALID_STR_OPERAND", right)
        if (op1.flags & USECS) != (op2.flags & USECS):
            _fail("TIMESTAMP_MISMATCH")
        if op == "/" and op2.flags & CONST and not op2.constant:
            _fail("DIVISION_BY_ZERO", right, errno.EDOM)
        for operand in (op1, op2):
            if operand.flags & VAR_REF:
                operand.read_once = True
        fn = _OPS[op]
        r1, r2 = op1.read, op2.read

        def read(rec, hit, refs):
            return fn(r1(rec, hit, refs), r2(rec, hit, refs))
        ts_flags = op1.flags & (TIMESTAMP | USECS)
        name = op1.expr_text() + op + op2.expr_text()
        if op1.flags & op2.flags & CONST:
            value = fn(op1.constant, op2.constant)
            return HistField("", CONST | ts_flags, lambda rec, hit, refs, _v=value: _v,
                             constant=value, var_name=var_name)
        return HistField(name, EXPR | ts_flags, read, 8, op1.is_signed,
                         var_name=var_name, operands=(op1, op2))

    def parse_unary(self, text: str, flags: int, var_name: str | None,
                    depth: list) -> HistField:
        depth[0] += 1
        if depth[0] > 3:
            _fail("TOO_MANY_SUBEXPR", text)
        body = text[1:]
        if "(" not in body:
            _fail(None)
        body = body[1:]
        close = body.rfind(")")
        if close < 0:
            _fail(None)
        if close != len(body) - 1:
            _fail("UNARY_MINUS_SUBEXPR", body)
        inner = body[:close]
        operand = self.parse_expr(inner, 0, None, depth)
        if operand.is_string:
            _fail("INVALID_STR_OPERAND", inner)
        r = operand.read
        return HistField(f"-({operand.expr_text()})", EXPR | (operand.flags & (TIMESTAMP | USECS)),
                         lambda rec, hit, refs: (-r(rec, hit, refs)) & _U64, 8, True,
                         var_name=var_name, operands=(operand,))

    # ---------------------------------------------------------- the fields
    def build(self) -> None:
        data, attrs = self.data, self.data.attrs
        data.vals.append(HistField("hitcount"))
        if attrs.vals:
            parts = attrs.vals.split(",")
            j = 1
            i = 0
            while i < len(parts) and i < _VALS_MAX and j < _VALS_MAX:
                part = parts[i]
                i += 1
                if part == "hitcount":
                    continue
                hf = self.parse_expr(part, 0, None, [0])
                if hf.is_string:
                    _fail(None)
                data.vals.append(hf)
                j += 1
            rest = parts[i:]
            if rest and rest != ["hitcount"]:
                _fail(None)
        names = set()
        for var_name, expr in _var_defs(attrs.assignments):
            if not self.remove and (var_name in names or self._var_on_event(var_name)):
                _fail("DUPLICATE_VAR", var_name)
            names.add(var_name)
            hf = self.parse_expr(expr, VAR, var_name, [0])
            hf.var_name = var_name
            hf.flags |= VAR
            data.vars.append(hf)
        keys = attrs.keys.split(",")
        if len(keys) > _KEYS_MAX:
            _fail(None)
        for key in keys:
            if key == "stacktrace":
                data.keys.append(HistField("stacktrace", STACKTRACE | KEY,
                                           lambda rec, hit, refs: hit.stack()[:_STACK_DEPTH]))
                continue
            hf = self.parse_expr(key, KEY, None, [0])
            if hf.flags & (VAR_REF | ALIAS) or any(
                    o.flags & VAR_REF for o in hf.operands):
                _fail("INVALID_REF_KEY", key)
            hf.flags |= KEY
            if hf.flags & EXPR or hf.flags & CONST:
                _fail(None)
            data.keys.append(hf)
        self.sort_keys()
        for text in attrs.actions:
            self.parse_action(text)
        # own variables referenced by this histogram's expressions resolve per entry
        for ref in data.var_refs:
            if ref.ref[0] is data:
                ref.read = lambda rec, hit, refs, _f=ref: _own_var(refs, _f)

    def sort_keys(self) -> None:
        data = self.data
        text = data.attrs.sort
        if text is None:
            return
        parts = text.split(",")
        sort_keys = []
        fields = data.vals + data.keys
        for i in range(_SORT_KEYS_MAX):
            if i >= len(parts):
                break
            part = parts[i]
            if not part:
                _fail("EMPTY_SORT_FIELD", "sort=")
            if i == _SORT_KEYS_MAX - 1 and len(parts) > _SORT_KEYS_MAX:
                _fail("TOO_MANY_SORT_FIELDS", "sort=")
            name, dot, modifier = part.partition(".")
            if not name:
                _fail("EMPTY_SORT_FIELD", "sort=")
            if dot:
                if modifier == "descending":
                    descending = True
                elif modifier == "ascending":
                    descending = False
                else:
                    _fail("INVALID_SORT_MODIFIER", modifier)
            else:
                descending = False
            if name == "hitcount":
                sort_keys.append((0, descending))
                continue
            for idx, hf in enumerate(fields):
                if idx and hf.name == name:
                    sort_keys.append((idx, descending))
                    break
            else:
                _fail("INVALID_SORT_FIELD", name)
        data.sort_keys = sort_keys or [(0, False)]

    def parse_action(self, text: str) -> None:
        data = self.data
        handler, _, rest = text.partition("(")
        close = rest.find(")")
        if close < 0:
            _fail("NO_CLOSING_PAREN", rest)
        arg, after = rest[:close], rest[close + 1:]
        if not after.startswith("."):
            _fail("ACTION_NOT_FOUND", after)
        action_name, paren, params_text = after[1:].partition("(")
        if not paren or not params_text.endswith(")"):
            _fail("NO_CLOSING_PAREN", after[1:])
        params = [p.strip() for p in params_text[:-1].split(",")] if params_text[:-1] else []
        if len(params) > _PARAMS_MAX:
            _fail("TOO_MANY_PARAMS")
        act = _Action(handler, "", action_name, params)
        if handler == "onmatch":
            system, dot, event = arg.partition(".")
            if not dot:
                _fail("SUBSYS_NOT_FOUND", system)
            if data.triggers.host.find_event(system, event) is None:
                _fail("INVALID_SUBSYS_EVENT", event)
            act.match_system, act.match_event = system, event
            if action_name in ("save", "snapshot"):
                _fail("ACTION_MISMATCH", action_name)
        else:
            if not arg.startswith("$"):
                _fail("ONX_NOT_VAR", arg)
            act.var_text = arg
            if self.find_var(None, None, arg[1:]) is None:
                _fail("ONX_VAR_NOT_FOUND", arg[1:])
            act.track_field = self.parse_var_ref(None, None, arg[1:], None)
        if action_name == "save":
            if not params:
                _fail("NO_SAVE_PARAMS")
            act.action = "save"
            act.param_fields = [self.parse_param(p) for p in params]
        elif action_name == "snapshot":
            act.action = "snapshot"
        else:
            act.action = "trace"
            if action_name == "trace":
                if not params:
                    _fail("SYNTH_EVENT_NOT_FOUND")
                act.use_trace_keyword = True
                act.synth_name = params[0]
                act.params = params[1:]
            else:
                act.synth_name = action_name
            synth = data.triggers.host.find_synth(act.synth_name)
            if synth is None:
                _fail("SYNTH_EVENT_NOT_FOUND", act.synth_name)
            if len(synth.fields) != len(act.params):
                _fail("SYNTH_COUNT_MISMATCH", act.synth_name)
            act.synth = synth
            act.param_fields = [self.parse_param(p) for p in act.params]
        data.actions.append(act)

    def parse_param(self, text: str) -> HistField:
        if text.startswith("$"):
            return self.parse_var_ref(None, None, text[1:], None)
        if text.count(".") >= 2:
            system, event, rest = text.split(".", 2)
            if rest.startswith("$"):
                return self.parse_var_ref(system, event, rest[1:], None)
            return self.field_var(system, event, rest)
        try:
            return self.parse_field(text, 0)
        except HistError:
            _fail("PARAM_NOT_FOUND", text)

    def field_var(self, system: str, event: str, name: str) -> HistField:
        """``SYS.EVENT.FIELD``: a variable ``synthetic_FIELD`` set by a histogram made
        for it on that event, keyed as that event's first histogram with as many keys
        (create_field_var_hist); it goes when this histogram goes."""
        host = self.triggers.host
        target = host.find_event(system, event)
        if target is None:
            _fail("EVENT_FILE_NOT_FOUND", name)
        pool = host.event_triggers(target)
        var = f"synthetic_{name}"
        if self.find_var(system, event, var) is None:
            compatible = next((t for t in pool.items if isinstance(t, HistTrigger)
                               and len(t.data.keys) == len(self.data.keys)), None)
            if compatible is None:
                _fail("HIST_NOT_FOUND", name)
            cmd = ("keys=" + ",".join(k.name for k in compatible.data.keys)
                   + f":{var}={name}")
            if compatible.filter_text is not None:
                cmd += f" if {compatible.filter_text}"
            try:
                _parse(pool, "hist", cmd)
            except (HistError, OSError):
                _fail("HIST_CREATE_FAIL", name)
            if not self.data.field_var_hists:
                self.data.on_release.append(lambda: _remove_field_var_hists(self.data))
            self.data.field_var_hists.append((pool, cmd))
        return self.parse_var_ref(system, event, var, None)


def _var_defs(assignments: list[str]) -> list[tuple[str, str]]:
    """(name, expression) of each variable the assignments define (parse_var_defs):
    one assignment may define several, separated by ','."""
    defs = []
    for assignment in assignments:
        for text in assignment.split(",")[:_VARS_MAX]:
            var_name, eq, expr = text.partition("=")
            if not eq:
                _fail("MALFORMED_ASSIGNMENT", var_name)
            if len(defs) == _VARS_MAX:
                _fail("TOO_MANY_VARS", var_name)
            defs.append((var_name, expr))
    return defs


def _var_in(pool: EventTriggers, name: str) -> HistData | None:
    """The first histogram of an event that defines variable ``name``."""
    for trig in pool.items:
        if isinstance(trig, HistTrigger) and any(v.var_name == name for v in trig.data.vars):
            return trig.data
    return None


_OPS = {
    "+": lambda a, b: (a + b) & _U64,
    "-": lambda a, b: (a - b) & _U64,
    "*": lambda a, b: (a * b) & _U64,
    "/": lambda a, b: a // b if b else _U64,
}


def _contains_operator(text: str) -> tuple[str | None, int]:
    """The root operator of an expression and its position (contains_operator)."""
    minus = text.rfind("-")
    if minus == 0:
        return "neg", 0
    plus = text.rfind("+")
    if plus >= 0 or minus >= 0:
        return ("+", plus) if plus > minus else ("-", minus)
    div = text.rfind("/")
    mult = text.rfind("*")
    if mult > div:
        return "*", mult
    if div >= 0:
        return "/", div
    return None, -1



def _remove_field_var_hists(data: HistData) -> None:
    """Take away the histograms made for ``data``'s field-variable params."""
    for pool, cmd in data.field_var_hists:
        try:
            _parse(pool, "!hist", cmd)
        except OSError:
            pass
    data.field_var_hists.clear()


def _split_filter(text: str) -> tuple[str, str | None]:
    """Separate ``k:v [if filter]``, allowing blanks in the trigger (Linux's scan)."""
    p = 0
    while True:
        p = text.find("if", p)
        if p < 0:
            return text, None
        if p == 0:
            _fail(None)
        if text[p - 1] not in " \t":
            p += 1
            continue
        if p >= len(text) - 2 - 1:
            _fail(None)
        if text[p + 2] not in " \t":
            p += 1
            continue
        return text[:p - 1].strip(" \t\n\v\f\r"), text[p:].strip(" \t\n\v\f\r")


def parse_hist_command(triggers: EventTriggers, glob: str, rest: str | None) -> None:
    """Apply one ``hist:…`` / ``!hist:…`` write to ``triggers`` (event_hist_trigger_parse)."""
    loc = f"hist:{triggers.loc}"
    last_cmd = f"hist:{rest}" if rest is not None else ""
    try:
        _parse(triggers, glob, rest)
    except HistError as exc:
        if exc.code and last_cmd:
            pos = last_cmd.find(exc.where) if exc.where else 0
            triggers.host.log_error(loc, last_cmd, HIST_ERRORS[exc.code], max(pos, 0))
        raise OSError(exc.errno, exc.strerror) from None


def _parse(triggers: EventTriggers, glob: str, rest: str | None) -> None:
    remove = glob.startswith("!")
    if rest is None:
        _fail(None)
    param, filter_text = _split_filter(rest)
    param = param.replace(".sym-offset", ".symXoffset")
    attrs = _parse_attrs(param)
    data = HistData(triggers, attrs)
    try:
        _Builder(data, remove).build()
        trig = HistTrigger("hist", "hist", data=data, post=False)
        trig.filter, trig.filter_text = compile_trigger_filter(
            None if filter_text is None else filter_text, triggers.fields)
        _apply(triggers, trig, remove)
    finally:
        if _unused(triggers, data):
            _remove_field_var_hists(data)


def _unused(triggers: EventTriggers, data: HistData) -> bool:
    """Whether no trigger of the event uses ``data`` (it was a removal, an update of
    an existing one, or it failed)."""
    return not any(isinstance(t, HistTrigger) and t.data is data for t in triggers.items)


def _apply(triggers: EventTriggers, trig: "HistTrigger", remove: bool) -> None:
    data, attrs = trig.data, trig.data.attrs
    existing = [t for t in triggers.items if isinstance(t, HistTrigger) and t.same(trig)]
    if remove:
        if existing:
            if existing[0].busy():
                raise HistError(errno.EBUSY)
            triggers.unregister(existing[0])
        return
    if existing and (attrs.pause or attrs.cont or attrs.clear):
        for old in _named_peers(triggers, existing[0]):
            if attrs.pause:
                old.paused = True
            elif attrs.cont:
                old.paused = False
        if attrs.clear:
            existing[0].data.clear()
        return
    named = _find_named(triggers, attrs.name) if attrs.name else None
    if named is not None:
        if named.data.spec().split(":", 2)[2:] != data.spec().split(":", 2)[2:]:
            _fail("NAMED_MISMATCH", attrs.name)
    if existing:
        _fail("TRIGGER_EEXIST", None, errno.EEXIST)
    if attrs.cont or attrs.clear:
        _fail("TRIGGER_ENOENT_CLEAR", None, errno.ENOENT)
    trig.paused = attrs.pause
    if named is not None:
        trig.data = named.data
    if data.enable_timestamps and not triggers.host.set_clock(attrs.clock):
        _fail("SET_CLOCK_FAIL", attrs.clock)
    host = triggers.host
    if named is None and any(a.action == "snapshot" for a in data.actions):
        # tracing_snapshot_cond_enable: hist.py decides each snapshot itself
        host.cond_snapshot_enable(data, lambda cond: True)
        data.on_release.append(lambda: host.cond_snapshot_disable(data))
    try:
        triggers.register(trig, append=True)
    except OSError:
        if named is None:
            host.cond_snapshot_disable(data)
        raise


def _find_named(triggers: EventTriggers, name: str) -> HistTrigger | None:
    """The histogram called ``name`` in any trace array (named triggers are global)."""
    for pool in triggers.host.all_triggers(everywhere=True):
        for trig in pool.items:
            if isinstance(trig, HistTrigger) and trig.data.attrs.name == name:
                return trig
    return None


def _named_peers(triggers: EventTriggers, trig: HistTrigger) -> list[HistTrigger]:
    if not trig.data.attrs.name:
        return [trig]
    return [t for pool in triggers.host.all_triggers(everywhere=True) for t in pool.items
            if isinstance(t, HistTrigger) and t.data is trig.data]
