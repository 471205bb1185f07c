/* lib.h - the few libc pieces a freestanding guest needs, and exit codes. */
#ifndef TG_LIB_H
#define TG_LIB_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Exit statuses written to the debug-exit port (docs/testguest.md). */
enum {
	EXIT_OK = 0,
	EXIT_FAIL_MODE = 3,	/* testguest.mode=fail */
	EXIT_MISMATCH = 4,	/* data mismatch or device/protocol violation */
	EXIT_NO_DEVICE = 5,	/* no usable virtio-vsock device */
	EXIT_RESET = 6,		/* connection refused or reset */
	EXIT_TIMEOUT = 7,	/* testguest.timeout passed without progress */
	EXIT_INTERNAL = 8,	/* bad command line, unsupported, out of memory */
	EXIT_EXCEPTION = 9,	/* a CPU exception or interrupt reached the IDT */
};

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

void *memcpy(void *dst, const void *src, size_t n);
void *memmove(void *dst, const void *src, size_t n);
void *memset(void *dst, int c, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);

/* snprintf subset: %d %i %u %x %X %s %c %p %%, flags '0' '-', a width, a
 * precision for %s (.N or .*),
 * length modifiers l, ll, z. Always NUL-terminates when n > 0; returns the
 * length the full output would have had. */
int tg_vsnprintf(char *buf, size_t n, const char *fmt, va_list ap);
int tg_snprintf(char *buf, size_t n, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Exit the VM with status code (port 0xf4). Never returns. */
__attribute__((noreturn)) void tg_exit(int code);

#endif
