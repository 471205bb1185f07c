/* console.c - polled 8250 UART on COM1, 115200 8N1. */
#include "console.h"
#include "lib.h"
#include "platform.h"

#define UART_THR 0 /* transmit holding (DLAB=0) */
#define UART_DLL 0 /* divisor low (DLAB=1) */
#define UART_IER 1
#define UART_DLM 1 /* divisor high (DLAB=1) */
#define UART_FCR 2 /* write */
#define UART_IIR 2 /* read */
#define UART_LCR 3
#define UART_MCR 4
#define UART_LSR 5
#define LSR_THRE 0x20
#define LCR_DLAB 0x80
#define LCR_8N1 0x03

/* Bytes we may write per THR-empty: 16 with a working 16550 FIFO, else 1.
 * Every port access is a VM exit (~40 us under PVM), so this matters. */
static int burst = 1;

void con_init(void)
{
	outb(PORT_COM1 + UART_IER, 0x00);	/* no interrupts */
	outb(PORT_COM1 + UART_LCR, LCR_DLAB);
	outb(PORT_COM1 + UART_DLL, 1);		/* 115200 baud */
	outb(PORT_COM1 + UART_DLM, 0);
	outb(PORT_COM1 + UART_LCR, LCR_8N1);
	outb(PORT_COM1 + UART_FCR, 0x07);	/* enable and clear FIFOs */
	outb(PORT_COM1 + UART_MCR, 0x03);	/* DTR, RTS */
	burst = (inb(PORT_COM1 + UART_IIR) & 0xc0) == 0xc0 ? 16 : 1;
}

void con_write(const char *s, size_t n)
{
	while (n) {
		/* Bounded: a missing or wedged UART must not hang the guest. */
		for (int i = 0; i < 100000; i++) {
			if (inb(PORT_COM1 + UART_LSR) & LSR_THRE)
				break;
			cpu_relax();
		}
		size_t k = MIN(n, (size_t)burst);
		for (size_t i = 0; i < k; i++)
			outb(PORT_COM1 + UART_THR, (uint8_t)s[i]);
		s += k;
		n -= k;
	}
}

static void vlog(const char *fmt, va_list ap)
{
	char line[256];
	static const char prefix[] = "testguest: ";
	memcpy(line, prefix, sizeof(prefix) - 1);
	size_t off = sizeof(prefix) - 1;
	int n = tg_vsnprintf(line + off, sizeof(line) - off - 1, fmt, ap);
	size_t len = off + MIN((size_t)n, sizeof(line) - off - 2);
	line[len++] = '\n';
	con_write(line, len);
}

void tg_log(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog(fmt, ap);
	va_end(ap);
}

void tg_die(int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog(fmt, ap);
	va_end(ap);
	tg_exit(code);
}
