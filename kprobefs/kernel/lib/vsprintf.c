/* A small vsnprintf: %d %i %u %x %X %o %s %c %p %% with flags, width, precision and the
 * l/ll/h/z length modifiers. */
#include "kernel.h"

#define ZEROPAD 1
#define SIGN 2
#define PLUS 4
#define SPACE 8
#define LEFT 16
#define SMALL 32
#define SPECIAL 64

struct printf_spec {
	unsigned int flags;
	int field_width;
	int precision;
	int base;
};

static char *put_char(char *buf, char *end, char c)
{
	if (buf < end)
		*buf = c;
	return buf + 1;
}

static char *number(char *buf, char *end, unsigned long num, struct printf_spec spec)
{
	static const char digits[16] = "0123456789ABCDEF";
	char tmp[24];
	char sign = 0;
	char locase = (spec.flags & SMALL) ? 0x20 : 0;
	int i = 0, size = spec.field_width;

	if ((spec.flags & SIGN) && (long)num < 0) {
		sign = '-';
		num = -(long)num;
		size--;
	} else if (spec.flags & PLUS) {
		sign = '+';
		size--;
	}
	if ((spec.flags & SPECIAL) && spec.base == 16)
		size -= 2;
	do {
		tmp[i++] = digits[num % spec.base] | locase;
		num /= spec.base;
	} while (num);
	if (i < spec.precision)
		spec.precision = i > spec.precision ? i : spec.precision;
	size -= spec.precision > i ? spec.precision : i;
	if (!(spec.flags & (ZEROPAD | LEFT)))
		while (size-- > 0)
			buf = put_char(buf, end, ' ');
	if (sign)
		buf = put_char(buf, end, sign);
	if ((spec.flags & SPECIAL) && spec.base == 16) {
		buf = put_char(buf, end, '0');
		buf = put_char(buf, end, 'X' | locase);
	}
	if (!(spec.flags & LEFT) && (spec.flags & ZEROPAD))
		while (size-- > 0)
			buf = put_char(buf, end, '0');
	while (i < spec.precision--)
		buf = put_char(buf, end, '0');
	while (i-- > 0)
		buf = put_char(buf, end, tmp[i]);
	while (size-- > 0)
		buf = put_char(buf, end, ' ');
	return buf;
}

static char *string(char *buf, char *end, const char *s, struct printf_spec spec)
{
	int len, i;

	if (!s)
		s = "(null)";
	len = strnlen(s, spec.precision < 0 ? 0x7fffffff : spec.precision);
	if (!(spec.flags & LEFT))
		while (len < spec.field_width--)
			buf = put_char(buf, end, ' ');
	for (i = 0; i < len; i++)
		buf = put_char(buf, end, s[i]);
	while (len < spec.field_width--)
		buf = put_char(buf, end, ' ');
	return buf;
}

static int skip_atoi(const char **s)
{
	int i = 0;

	while (**s >= '0' && **s <= '9')
		i = i * 10 + *((*s)++) - '0';
	return i;
}

int vsnprintf(char *buf, size_t size, const char *fmt, __builtin_va_list args)
{
	char *str = buf, *end = buf + size;

	for (; *fmt; fmt++) {
		struct printf_spec spec = { 0, -1, -1, 10 };
		int qualifier = 0;
		unsigned long num;

		if (*fmt != '%') {
			str = put_char(str, end, *fmt);
			continue;
		}
		for (;;) {
			fmt++;
			if (*fmt == '-')
				spec.flags |= LEFT;
			else if (*fmt == '+')
				spec.flags |= PLUS;
			else if (*fmt == ' ')
				spec.flags |= SPACE;
			else if (*fmt == '#')
				spec.flags |= SPECIAL;
			else if (*fmt == '0')
				spec.flags |= ZEROPAD;
			else
				break;
		}
		if (*fmt >= '0' && *fmt <= '9')
			spec.field_width = skip_atoi(&fmt);
		else if (*fmt == '*')
			spec.field_width = __builtin_va_arg(args, int), fmt++;
		if (*fmt == '.') {
			fmt++;
			if (*fmt == '*')
				spec.precision = __builtin_va_arg(args, int), fmt++;
			else
				spec.precision = skip_atoi(&fmt);
		}
		while (*fmt == 'l' || *fmt == 'h' || *fmt == 'z' || *fmt == 'L')
			qualifier = *fmt++;
		/* A dense switch over the conversion letter: gcc makes this a jump table. */
		switch (*fmt) {
		case 'c':
			str = put_char(str, end, (char)__builtin_va_arg(args, int));
			continue;
		case 's':
			str = string(str, end, __builtin_va_arg(args, const char *), spec);
			continue;
		case 'p':
			spec.flags |= SMALL | ZEROPAD;
			spec.field_width = 16;
			spec.base = 16;
			str = number(str, end, (unsigned long)__builtin_va_arg(args, void *), spec);
			continue;
		case '%':
			str = put_char(str, end, '%');
			continue;
		case 'o':
			spec.base = 8;
			break;
		case 'x':
			spec.flags |= SMALL;
			/* fall through */
		case 'X':
			spec.base = 16;
			break;
		case 'd':
		case 'i':
			spec.flags |= SIGN;
			break;
		case 'u':
			break;
		case 'n':
		case 'e':
		case 'f':
		case 'g':
		case 'a':
			continue;
		default:
			str = put_char(str, end, '%');
			if (*fmt)
				str = put_char(str, end, *fmt);
			else
				fmt--;
			continue;
		}
		if (qualifier == 'l' || qualifier == 'z' || qualifier == 'L')
			num = __builtin_va_arg(args, unsigned long);
		else if (spec.flags & SIGN)
			num = (long)__builtin_va_arg(args, int);
		else
			num = __builtin_va_arg(args, unsigned int);
		if (qualifier == 'h')
			num = (spec.flags & SIGN) ? (unsigned long)(long)(short)num : (u16)num;
		str = number(str, end, num, spec);
	}
	if (size) {
		if (str < end)
			*str = 0;
		else
			end[-1] = 0;
	}
	return str - buf;
}

int snprintf(char *buf, size_t size, const char *fmt, ...)
{
	__builtin_va_list args;
	int i;

	__builtin_va_start(args, fmt);
	i = vsnprintf(buf, size, fmt, args);
	__builtin_va_end(args);
	return i;
}

int scnprintf(char *buf, size_t size, const char *fmt, ...)
{
	__builtin_va_list args;
	int i;

	__builtin_va_start(args, fmt);
	i = vsnprintf(buf, size, fmt, args);
	__builtin_va_end(args);
	if (i < (int)size)
		return i;
	return size ? size - 1 : 0;
}
