/*
 * fake.h - the fake machine behind a HOST_TEST build: low memory, a clock,
 * a console capture, a virtio-mmio vsock device, a scriptable host peer, and
 * for irq mode a LAPIC, an IOAPIC and 8259 masks.
 * Single-threaded: the device runs inside the guest's notify writes,
 * wait-port sleeps and irq-mode spins; an interrupt is delivered (tg_irq()
 * called, as boot.S would) after any MMIO access or spin once it is raised,
 * routed and the guest has interrupts on.
 */
#ifndef TG_TEST_FAKE_H
#define TG_TEST_FAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FAKE_MMIO_BASE 0xd0000000ull
#define FAKE_MMIO_SIZE 0x1000ull
#define FAKE_TSC_HZ 1000000000ull /* the fake CPUID says 1 GHz */
#define FAKE_APIC_ID 2		  /* the BSP's LAPIC id: not 0, so it must be read */
#define FAKE_IOAPIC_PINS 24

/* Low 1 MiB of "physical" memory (BDA, EBDA, BIOS area). */
extern uint8_t fake_lowmem[0x100000];

/* Clock. */
extern uint64_t fake_tsc;

/* Host side behaviour, set by a scenario before the guest runs. */
enum host_close { HC_SHUT_BOTH, HC_SHUT_SEND, HC_RST, HC_WAIT_GUEST };
enum host_rx { HR_NONE, HR_ECHO, HR_PATTERN };
enum fault {
	F_NONE,
	F_RX_BAD_ID,	 /* RX used id out of range */
	F_RX_BAD_LEN,	 /* RX used len beyond the buffer */
	F_RX_HDR_LEN,	 /* header len larger than the used len says */
	F_TX_BAD_ID,	 /* TX used id never posted */
	F_USED_IDX_JUMP, /* used idx jumps past the queue size */
	F_TRANSPORT_RESET, /* a TRANSPORT_RESET event */
};

struct host_cfg {
	/* Device. */
	uint32_t device_id, version, qmax;
	bool event_idx;	   /* offer VIRTIO_F_EVENT_IDX */
	bool no_version_1; /* offer no VIRTIO_F_VERSION_1 */
	uint64_t cid;
	enum fault fault;
	uint64_t fault_after; /* packets delivered before the fault */

	/* Host-initiated connections to guest_port (echo/sink/source). */
	int nconns, conc;
	uint32_t guest_port;
	uint64_t send_bytes;  /* host -> guest per connection */
	uint64_t expect_rx;   /* guest -> host per connection */
	enum host_rx rx_kind; /* what the guest's bytes must be */
	enum host_close close_kind;
	bool ignore_credit; /* overrun the guest's window */

	/* Host listener (connect mode). */
	bool listen;
	uint32_t listen_port;
	bool refuse, silent;
	int64_t corrupt_at; /* echo stream offset to flip, -1 none */
	bool close_early;   /* RST after half the bytes */

	/* Host socket buffer and reader. */
	uint32_t host_buf_alloc;
	uint32_t read_chunk;   /* bytes consumed per step, 0 = all */
	uint32_t stall_steps;  /* steps before the host reader starts */
	bool credit_requests;  /* send CREDIT_REQUEST when stalled */
	bool no_rst_reply;     /* never answer the guest's SHUTDOWN */

	/* Interrupts (irq mode). */
	uint32_t irq_pin; /* the device's IOAPIC pin (DEV says 5) */
	bool irq_drop;	  /* the IOAPIC loses every interrupt */
	bool pvm;	  /* CPL3 sees IOPL 0, as under a PVM host */
};

extern struct host_cfg hcfg;

void fake_reset(void);
uint32_t fake_mmio_read(uint64_t off);
void fake_mmio_write(uint64_t off, uint32_t v);
/* The paravirtual wait port: returns at once if the device raised an
 * interrupt since the last wait, else advances the clock and runs the
 * device. */
void fake_wait(uint32_t us);
/* An irq-mode spin: advances the clock by us and runs the device. */
void fake_idle(uint32_t us);
/* On guest exit: did the host side see everything it expected? Returns 0
 * or writes a reason. */
int fake_final_check(char *why, size_t n);

/* The device raises its interrupt line (an edge on hcfg.irq_pin). */
void fake_irq_raise(void);
/* Is tg_irq() running (the only code that may read InterruptStatus in irq
 * mode)? */
bool fake_in_irq_handler(void);
/* On guest exit 0 in irq mode: interrupts delivered and EOIed, the 8259s and
 * LINT0 masked. Returns 0 or writes a reason. */
int fake_irq_final_check(char *why, size_t n);

/* Host-side failure: print and end the child with status 100. */
__attribute__((noreturn, format(printf, 1, 2))) void host_fail(const char *fmt, ...);

#endif
