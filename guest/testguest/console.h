/* console.h - COM1 output, one line per message, prefixed "testguest: ". */
#ifndef TG_CONSOLE_H
#define TG_CONSOLE_H

#include <stddef.h>

void con_init(void);
void con_write(const char *s, size_t n);

/* Print "testguest: <formatted>\n". Lines end in a bare '\n'. */
void tg_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* tg_log, then tg_exit(code). */
__attribute__((noreturn, format(printf, 2, 3))) void tg_die(int code, const char *fmt, ...);

#endif
