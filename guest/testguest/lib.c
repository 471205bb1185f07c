/* lib.c - memory and string helpers, formatting, exit. */
#include "lib.h"
#include "platform.h"

#ifndef HOST_TEST
/*
 * gcc may emit calls to these even with -ffreestanding, so they must exist
 * and must not be written as loops gcc could turn back into calls to
 * themselves: use the string instructions (fast with ERMS, and plain CPL3
 * code).
 */
void *memcpy(void *dst, const void *src, size_t n)
{
	void *d = dst;
	__asm__ __volatile__("rep movsb" : "+D"(d), "+S"(src), "+c"(n) : : "memory");
	return dst;
}

void *memmove(void *dst, const void *src, size_t n)
{
	if ((uintptr_t)dst <= (uintptr_t)src || (uintptr_t)dst >= (uintptr_t)src + n)
		return memcpy(dst, src, n);
	/* Overlapping, destination above source: copy backwards. */
	void *d = (char *)dst + n - 1;
	const void *s = (const char *)src + n - 1;
	__asm__ __volatile__("std\n\trep movsb\n\tcld"
			     : "+D"(d), "+S"(s), "+c"(n)
			     :
			     : "memory");
	return dst;
}

void *memset(void *dst, int c, size_t n)
{
	void *d = dst;
	__asm__ __volatile__("rep stosb" : "+D"(d), "+c"(n) : "a"(c) : "memory");
	return dst;
}

int memcmp(const void *a, const void *b, size_t n)
{
	const uint8_t *x = a, *y = b;
	/* Word at a time while equal, then find the byte. */
	while (n >= 8) {
		uint64_t u, v;
		__builtin_memcpy(&u, x, 8);
		__builtin_memcpy(&v, y, 8);
		if (u != v)
			break;
		x += 8;
		y += 8;
		n -= 8;
	}
	for (; n; n--, x++, y++) {
		if (*x != *y)
			return *x < *y ? -1 : 1;
	}
	return 0;
}

size_t strlen(const char *s)
{
	size_t n = 0;
	while (s[n])
		n++;
	return n;
}

__attribute__((noreturn)) void tg_exit(int code)
{
	outb(PORT_DEBUG_EXIT, (uint8_t)code);
	/* No debug-exit device: park. hlt is privileged at CPL3, so sleep
	 * through the paravirtual wait port (a no-op where it is absent). */
	for (;;)
		outl(PORT_PV_WAIT, 100000);
}
#endif /* !HOST_TEST */

struct out {
	char *buf;
	size_t n, len;
};

static void put(struct out *o, char c)
{
	if (o->len + 1 < o->n)
		o->buf[o->len] = c;
	o->len++;
}

static void put_num(struct out *o, uint64_t v, bool neg, unsigned base, bool upper,
		    int width, bool zero, bool left)
{
	char tmp[24];
	const char *digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
	int k = 0;
	do {
		tmp[k++] = digits[v % base];
		v /= base;
	} while (v);
	int len = k + (neg ? 1 : 0);
	if (!left && !zero)
		for (; width > len; width--)
			put(o, ' ');
	if (neg)
		put(o, '-');
	if (!left && zero)
		for (; width > len; width--)
			put(o, '0');
	while (k)
		put(o, tmp[--k]);
	if (left)
		for (; width > len; width--)
			put(o, ' ');
}

int tg_vsnprintf(char *buf, size_t n, const char *fmt, va_list ap)
{
	struct out o = { buf, n, 0 };
	for (const char *p = fmt; *p; p++) {
		if (*p != '%') {
			put(&o, *p);
			continue;
		}
		p++;
		bool zero = false, left = false;
		for (;; p++) {
			if (*p == '0')
				zero = true;
			else if (*p == '-')
				left = true;
			else
				break;
		}
		int width = 0;
		while (*p >= '0' && *p <= '9')
			width = width * 10 + (*p++ - '0');
		int prec = -1; /* only %s uses a precision */
		if (*p == '.') {
			p++;
			prec = 0;
			if (*p == '*') {
				prec = va_arg(ap, int);
				p++;
			} else {
				while (*p >= '0' && *p <= '9')
					prec = prec * 10 + (*p++ - '0');
			}
		}
		int lng = 0;
		while (*p == 'l' || *p == 'z') {
			lng++;
			p++;
		}
		switch (*p) {
		case 'd':
		case 'i': {
			int64_t v = lng ? va_arg(ap, int64_t) : va_arg(ap, int);
			uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
			put_num(&o, u, v < 0, 10, false, width, zero, left);
			break;
		}
		case 'u':
		case 'x':
		case 'X': {
			uint64_t v = lng ? va_arg(ap, uint64_t) : va_arg(ap, unsigned);
			put_num(&o, v, false, *p == 'u' ? 10 : 16, *p == 'X', width, zero, left);
			break;
		}
		case 'p':
			put(&o, '0');
			put(&o, 'x');
			put_num(&o, (uint64_t)(uintptr_t)va_arg(ap, void *), false, 16, false, 0,
				false, false);
			break;
		case 's': {
			const char *s = va_arg(ap, const char *);
			if (!s)
				s = "(null)";
			int len = 0;
			while (s[len] && (prec < 0 || len < prec))
				len++;
			if (!left)
				for (; width > len; width--)
					put(&o, ' ');
			for (int i = 0; i < len; i++)
				put(&o, s[i]);
			for (; width > len; width--)
				put(&o, ' ');
			break;
		}
		case 'c':
			put(&o, (char)va_arg(ap, int));
			break;
		case '%':
			put(&o, '%');
			break;
		case '\0':
			p--; /* a trailing '%': stop at the NUL */
			break;
		default:
			put(&o, '%');
			put(&o, *p);
			break;
		}
	}
	if (n)
		buf[o.len < n ? o.len : n - 1] = '\0';
	return (int)o.len;
}

int tg_snprintf(char *buf, size_t n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int r = tg_vsnprintf(buf, n, fmt, ap);
	va_end(ap);
	return r;
}
