/*
 * host_test.c - host-side tests of the test guest's C code.
 *
 * Unit tests call the pure functions (formatting, command line, MP/ACPI
 * parsing, credit arithmetic, memory ranges). Scenario tests fork a child
 * that boots the whole guest (tg_main) against the fake machine in
 * fakedev.c and check its exit status and console output; a child that the
 * host side catches misbehaving exits 100.
 *
 *   build/host_test            run everything
 *   build/host_test -v NAME    run scenarios whose name contains NAME,
 *                              printing their console output
 *   build/host_test -boot DUMP ADDR
 *                              boot the guest over a dump of low memory
 *                              (the first MiB, as a VMM's loader wrote it)
 *                              with hvm_start_info at ADDR: checks what the
 *                              loader writes (start_info, memory map,
 *                              command line, MP table) the way the guest
 *                              reads it
 */
#include "cmdline.h"
#include "fake.h"
#include "lib.h"
#include "mem.h"
#include "modes.h"
#include "pattern.h"
#include "platform.h"
#include "tables.h"
#include "vsock.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

void tg_main(uint64_t start_info_pa);

static int failures, checks;
static bool verbose;
static const char *only;

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		checks++;                                                  \
		if (!(cond)) {                                             \
			failures++;                                        \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);        \
			printf(__VA_ARGS__);                               \
			printf("\n");                                      \
		}                                                          \
	} while (0)

/* ---- formatting ---- */

static void test_format(void)
{
	char b[64];
	struct {
		const char *want;
		int n;
	} cases[] = {
		{ "x=42 y=-7 z=ff", tg_snprintf(b, sizeof(b), "x=%d y=%d z=%x", 42, -7, 255) },
	};
	CHECK(strcmp(b, cases[0].want) == 0, "got '%s'", b);
	tg_snprintf(b, sizeof(b), "%lu|%08x|%5s|%-3s|%c|%%|%.*s", 18446744073709551615ul, 0xbeef,
		    "ab", "c", 'q', 3, "abcdef");
	CHECK(strcmp(b, "18446744073709551615|0000beef|   ab|c  |q|%|abc") == 0, "got '%s'", b);
	int n = tg_snprintf(b, 5, "%s", "abcdefgh");
	CHECK(n == 8 && strcmp(b, "abcd") == 0, "truncation: n=%d '%s'", n, b);
	tg_snprintf(b, sizeof(b), "%ld %d", (int64_t)-9223372036854775807 - 1, -2147483647 - 1);
	CHECK(strcmp(b, "-9223372036854775808 -2147483648") == 0, "min ints: '%s'", b);
}

/* ---- command line ---- */

static void test_cmdline(void)
{
	struct tg_config c;
	char err[160];
	CHECK(cmdline_parse("testguest.mode=hello", &c, err, sizeof(err)) == 0 &&
		      c.mode == MODE_HELLO && c.timeout_s == 30 && c.bufsize == 4096 && c.ndevs == 0,
	      "hello: %s", err);
	CHECK(cmdline_parse("console=ttyS0 virtio_mmio.device=512@0xfeb00e00:12 "
			    "virtio_mmio.device=4K@0xd0000000:5:3  testguest.mode=echo\t"
			    "testguest.port=1234 testguest.conns=40 testguest.timeout=0 "
			    "testguest.bufsize=64K",
			    &c, err, sizeof(err)) == 0,
	      "echo: %s", err);
	CHECK(c.ndevs == 2 && c.devs[0].base == 0xfeb00e00 && c.devs[0].size == 512 &&
		      c.devs[0].irq == 12 && c.devs[1].base == 0xd0000000 &&
		      c.devs[1].size == 4096 && c.devs[1].irq == 5,
	      "devices parsed wrong");
	CHECK(c.mode == MODE_ECHO && c.port == 1234 && c.has_conns && c.conns == 40 &&
		      c.timeout_s == 0 && c.bufsize == 65536,
	      "echo values wrong");
	CHECK(cmdline_parse("testguest.mode=connect testguest.port=0x400 testguest.bytes=1M", &c, err,
			    sizeof(err)) == 0 &&
		      c.port == 1024 && c.bytes == 1048576,
	      "connect: %s", err);
	CHECK(cmdline_parse("testguest.mode=fail testguest.mode=hello", &c, err, sizeof(err)) == 0 &&
		      c.mode == MODE_HELLO,
	      "last value wins");

	const char *bad[] = {
		"",
		"testguest.mode=",
		"testguest.mode=bogus",
		"testguest.mode=echo",
		"testguest.mode=connect testguest.port=1",
		"testguest.mode=source testguest.bytes=1",
		"testguest.mode=hello testguest.prot=1",
		"testguest.mode=hello testguest.port=4294967295",
		"testguest.mode=hello testguest.port=12x",
		"testguest.mode=hello testguest.conns=0",
		"testguest.mode=hello testguest.bufsize=63",
		"testguest.mode=hello testguest.bufsize=65537",
		"testguest.mode=hello testguest.irq=2",
		"testguest.mode=hello testguest.timeout=1000001",
		"testguest.mode=hello testguest.bytes=99999999999999999999",
		"testguest.mode=hello testguest.bytes=0xffffffffffffffffK",
		"testguest.mode=hello virtio_mmio.device=512@0xfeb00e00",
		"testguest.mode=hello virtio_mmio.device=512",
		"testguest.mode=hello virtio_mmio.device=0x10@0xd0000000:5",
		"testguest.mode=hello virtio_mmio.device=4K@zz:5",
		"testguest.mode=hello virtio_mmio.device=4Q@0xd0000000:5",
		"testguest.mode=hello virtio_mmio.device=4K@0xd0000000:5:",
		"testguest.mode=hello virtio_mmio.device=4K@0xd0000000:5K",
		"testguest.mode",
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		int r = cmdline_parse(bad[i], &c, err, sizeof(err));
		CHECK(r == -1 && err[0], "accepted '%s'", bad[i]);
	}
	char many[1024] = "testguest.mode=hello";
	for (int i = 0; i < TG_MAX_MMIO_DEVS + 1; i++)
		strcat(many, " virtio_mmio.device=4K@0xd0000000:5");
	CHECK(cmdline_parse(many, &c, err, sizeof(err)) == -1, "too many devices accepted");

	uint64_t v;
	const char *s = "0x1fK";
	CHECK(parse_u64(s, s + strlen(s), true, &v) == 0 && v == 31 * 1024, "0x1fK");
	s = "18446744073709551615";
	CHECK(parse_u64(s, s + strlen(s), false, &v) == 0 && v == UINT64_MAX, "u64 max");
	s = "18446744073709551616";
	CHECK(parse_u64(s, s + strlen(s), false, &v) == -1, "u64 overflow");
	s = "0x";
	CHECK(parse_u64(s, s + strlen(s), false, &v) == -1, "bare 0x");
}

/* ---- tables ---- */

/* Two windows of fake physical memory: [0, 1 MiB) and [hi_base, +64 KiB). */
static uint8_t lowbuf[0x100000], hibuf[0x10000];
#define HI_BASE 0x7ff0000ull

static const void *buf_map(void *ctx, uint64_t pa, uint64_t len)
{
	(void)ctx;
	if (pa < sizeof(lowbuf) && len <= sizeof(lowbuf) - pa)
		return lowbuf + pa;
	if (pa >= HI_BASE && pa - HI_BASE < sizeof(hibuf) && len <= sizeof(hibuf) - (pa - HI_BASE))
		return hibuf + (pa - HI_BASE);
	return NULL;
}

static void fix_sum(uint8_t *p, size_t n, size_t at)
{
	uint8_t s = 0;
	p[at] = 0;
	for (size_t i = 0; i < n; i++)
		s = (uint8_t)(s + p[i]);
	p[at] = (uint8_t)-s;
}

/* An MP table as qboot builds it (entry count 0) at fpa, config at fpa+16. */
static void build_mp(uint8_t *mem, uint32_t fpa, int cpus, int disabled, bool count_field)
{
	uint8_t *f = mem + fpa, *t = f + 16;
	memset(f, 0, 16);
	memcpy(f, "_MP_", 4);
	uint32_t cpa = fpa + 16;
	memcpy(f + 4, &cpa, 4);
	f[8] = 1;
	f[9] = 4;
	fix_sum(f, 16, 10);
	memset(t, 0, 44);
	memcpy(t, "PCMP", 4);
	t[6] = 4;
	uint32_t off = 44;
	int entries = 0;
	for (int i = 0; i < cpus + disabled; i++) {
		memset(t + off, 0, 20);
		t[off] = 0;
		t[off + 1] = (uint8_t)i;
		t[off + 3] = i < cpus ? 1 : 0;
		off += 20;
		entries++;
	}
	uint8_t bus[8] = { 1, 0, 'I', 'S', 'A', ' ', ' ', ' ' };
	memcpy(t + off, bus, 8);
	off += 8;
	uint8_t ioapic[8] = { 2, 3, 0x14, 1, 0, 0, 0xc0, 0xfe };
	memcpy(t + off, ioapic, 8);
	off += 8;
	entries += 2;
	uint16_t len = (uint16_t)off, cnt = count_field ? (uint16_t)entries : 0;
	memcpy(t + 4, &len, 2);
	memcpy(t + 34, &cnt, 2);
	fix_sum(t, off, 7);
}

/* RSDP at rpa (v1 or v2), root table and MADT in the high window. */
static void build_acpi(uint32_t rpa, bool v2, int lapics, int x2apics, int disabled)
{
	uint8_t *r = lowbuf + rpa;
	memset(r, 0, 36);
	memcpy(r, "RSD PTR ", 8);
	r[15] = v2 ? 2 : 0;
	uint64_t root = HI_BASE, madt = HI_BASE + 0x1000;
	uint32_t root32 = (uint32_t)root;
	memcpy(r + 16, &root32, 4);
	fix_sum(r, 20, 8);
	if (v2) {
		uint32_t len = 36;
		memcpy(r + 20, &len, 4);
		memcpy(r + 24, &root, 8);
		fix_sum(r, 36, 32);
	}
	uint8_t *rt = hibuf;
	memset(rt, 0, 64);
	memcpy(rt, v2 ? "XSDT" : "RSDT", 4);
	uint32_t esz = v2 ? 8 : 4;
	/* Two entries: a junk pointer (unmapped), then the MADT. */
	uint64_t junk = 0xfee00000;
	memcpy(rt + 36, &junk, esz);
	memcpy(rt + 36 + esz, &madt, esz);
	uint32_t rlen = 36 + 2 * esz;
	memcpy(rt + 4, &rlen, 4);
	fix_sum(rt, rlen, 9);

	uint8_t *m = hibuf + 0x1000;
	memset(m, 0, 0x800);
	memcpy(m, "APIC", 4);
	uint32_t off = 44;
	for (int i = 0; i < lapics + disabled; i++) {
		uint8_t e[8] = { 0, 8, (uint8_t)i, (uint8_t)i, i < lapics ? 1 : 0, 0, 0, 0 };
		memcpy(m + off, e, 8);
		off += 8;
	}
	uint8_t io[12] = { 1, 12, 0, 0, 0, 0, 0xc0, 0xfe, 0, 0, 0, 0 };
	memcpy(m + off, io, 12);
	off += 12;
	for (int i = 0; i < x2apics; i++) {
		uint8_t e[16] = { 9, 16, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0 };
		memcpy(m + off, e, 16);
		off += 16;
	}
	memcpy(m + 4, &off, 4);
	fix_sum(m, off, 9);
}

static void test_tables(void)
{
	struct physmem m = { buf_map, NULL };
	enum cpu_source src;

	memset(lowbuf, 0, sizeof(lowbuf));
	CHECK(count_cpus(&m, 0, &src) == 0 && src == CPUS_NONE, "empty memory");

	build_mp(lowbuf, 0x9fc00, 2, 0, false);
	CHECK(count_cpus(&m, 0, &src) == 2 && src == CPUS_MP, "qboot-style MP table");
	build_mp(lowbuf, 0x9fc00, 3, 2, true);
	CHECK(mp_count_cpus(&m) == 3, "MP with disabled cpus and a count");
	lowbuf[0x9fc00 + 16 + 50] ^= 1; /* break the config checksum */
	CHECK(mp_count_cpus(&m) == 0, "bad MP config checksum accepted");

	memset(lowbuf, 0, sizeof(lowbuf));
	build_mp(lowbuf, 0xf5a30 & ~15u, 4, 0, false);
	CHECK(mp_count_cpus(&m) == 4, "MP table in the BIOS area");
	memset(lowbuf, 0, sizeof(lowbuf));
	lowbuf[0x40e] = 0x00;
	lowbuf[0x40f] = 0x90; /* EBDA segment 0x9000 -> 0x90000 */
	build_mp(lowbuf, 0x90000 + 0x200, 5, 0, false);
	CHECK(mp_count_cpus(&m) == 5, "MP table in the EBDA");
	/* Config table pointer out of mapped memory. */
	uint32_t bogus = 0x20000000;
	memcpy(lowbuf + 0x90200 + 4, &bogus, 4);
	fix_sum(lowbuf + 0x90200, 16, 10);
	CHECK(mp_count_cpus(&m) == 0, "MP config pointer outside memory");
	/* Base table length running past the window. */
	memset(lowbuf, 0, sizeof(lowbuf));
	build_mp(lowbuf, 0x9fc00, 1, 0, false);
	uint16_t long_len = 0xffff; /* 0x9fc10 + 0xffff runs past the window */
	memcpy(lowbuf + 0x9fc10 + 4, &long_len, 2);
	memcpy(lowbuf + 0x9fc10 - 16 + 4, &(uint32_t){ 0xf8000 }, 4);
	fix_sum(lowbuf + 0x9fc00, 16, 10);
	memcpy(lowbuf + 0xf8000, lowbuf + 0x9fc10, 128);
	CHECK(mp_count_cpus(&m) == 0, "MP table past the end of memory");
	/* Unknown entry type stops the walk, keeping what was counted. */
	memset(lowbuf, 0, sizeof(lowbuf));
	build_mp(lowbuf, 0x9fc00, 2, 0, false);
	lowbuf[0x9fc10 + 44 + 40] = 0x80;
	fix_sum(lowbuf + 0x9fc10, 44 + 40 + 16, 7);
	CHECK(mp_count_cpus(&m) == 2, "unknown MP entry");

	memset(lowbuf, 0, sizeof(lowbuf));
	build_mp(lowbuf, 0x9fc00, 1, 0, false);
	build_acpi(0xe0000 + 0x40, false, 3, 0, 1);
	CHECK(count_cpus(&m, 0, &src) == 3 && src == CPUS_MADT, "MADT via scanned RSDP v1");
	build_acpi(0xe0000 + 0x40, true, 2, 2, 0);
	CHECK(acpi_count_cpus(&m, 0) == 4, "MADT via XSDT with x2APIC entries");
	memset(lowbuf + 0xe0040, 0, 36);
	build_acpi(0x9f000, true, 6, 0, 0);
	CHECK(acpi_count_cpus(&m, 0x9f000) == 6, "RSDP from start_info");
	CHECK(acpi_count_cpus(&m, 0) == 0, "RSDP outside the scanned areas");
	hibuf[0x1000 + 10] ^= 0x55; /* MADT checksum */
	CHECK(acpi_count_cpus(&m, 0x9f000) == 0, "bad MADT checksum accepted");
	CHECK(count_cpus(&m, 0x9f000, &src) == 1 && src == CPUS_MP, "MP fallback");
	build_acpi(0x9f000, true, 6, 0, 0);
	uint32_t huge = 0x7fffffff;
	memcpy(hibuf + 0x1000 + 4, &huge, 4); /* MADT longer than memory */
	CHECK(acpi_count_cpus(&m, 0x9f000) == 0, "MADT length beyond memory");
	build_acpi(0x9f000, true, 2, 0, 0);
	hibuf[0x1000 + 44 + 1] = 200; /* first entry claims 200 bytes */
	fix_sum(hibuf + 0x1000, 44 + 8 + 12, 9);
	CHECK(acpi_count_cpus(&m, 0x9f000) == 0, "MADT entry past the table");
}

/* ---- memory ---- */

static void test_mem(void)
{
	mem_reset();
	mem_allow(0, 0x1000);
	mem_allow(0x1000, 0x1000); /* adjacent: merges */
	mem_allow(0x10000, 0x100);
	CHECK(phys_map(0xff0, 0x20) != NULL, "merged ranges");
	CHECK(phys_map(0x1ff0, 0x20) == NULL, "past the end");
	CHECK(phys_map(0x10000, 0x100) != NULL && phys_map(0x10000, 0x101) == NULL, "exact end");
	CHECK(phys_map(UINT64_MAX - 4, 16) == NULL, "wraparound");
	CHECK(phys_map(0x100, 0) == NULL, "empty range");
	mem_allow(0x800, 0x10000); /* overlaps both */
	CHECK(phys_map(0, 0x10100) != NULL, "merge across");
	mem_reset();
	CHECK(phys_map_loader(PHYS_LIMIT - 8, 8) != NULL && phys_map_loader(PHYS_LIMIT - 8, 9) == NULL,
	      "loader limit");
}

/* ---- credit ---- */

static void test_credit(void)
{
	struct conn c;
	memset(&c, 0, sizeof(c));
	c.peer_buf_alloc = 65536;
	c.tx_cnt = 0xfffffff0u;
	c.peer_fwd_cnt = 0xffffff00u;
	CHECK(vsock_peer_credit(&c) == 65536 - 0xf0, "credit before wrap");
	c.tx_cnt = 0x10; /* wrapped */
	CHECK(vsock_peer_credit(&c) == 65536 - 0x110, "credit across wrap: %u",
	      vsock_peer_credit(&c));
	c.peer_fwd_cnt = 0x20; /* peer claims more than we sent */
	CHECK(vsock_peer_credit(&c) == 0, "fwd_cnt ahead of tx_cnt");
	c.peer_fwd_cnt = 0x10;
	c.peer_buf_alloc = 0;
	CHECK(vsock_peer_credit(&c) == 0, "zero buf_alloc");
	c.peer_buf_alloc = 100;
	c.tx_cnt = 0x10 + 200; /* peer shrank its buffer */
	CHECK(vsock_peer_credit(&c) == 0, "shrunk buffer");

	memset(&c, 0, sizeof(c));
	c.buf_alloc = VSOCK_BUF_ALLOC;
	c.rx_cnt = 0xffff0000u + 100 * 1024;
	c.fwd_told = 0xffff0000u;
	c.fwd_cnt = c.fwd_told;
	CHECK(!vsock_need_credit_update(&c), "nothing consumed");
	c.fwd_cnt = c.rx_cnt;
	CHECK(!vsock_need_credit_update(&c), "peer still sees > half free");
	c.rx_cnt += 60 * 1024; /* wraps; peer sees 96 KiB free */
	CHECK(vsock_need_credit_update(&c), "peer sees < half free across wrap");
	c.peer_shut = VSOCK_SHUTDOWN_SEND;
	CHECK(!vsock_need_credit_update(&c), "no update to a peer done sending");
}

static void test_pattern(void)
{
	bool ok = true;
	for (uint64_t i = 0; i < 3 * PATTERN_PERIOD; i++)
		ok &= pattern_byte(i) == pattern_byte(i % PATTERN_PERIOD) &&
		      pattern_byte(i) == (uint8_t)((i * 7 + (i >> 8)) & 0xff);
	ok &= pattern_byte(0x123456789ull) == pattern_byte(0x123456789ull % PATTERN_PERIOD);
	CHECK(ok, "pattern is not 64 KiB periodic");
}

/* ---- scenarios: the whole guest against the fake machine ---- */

struct hvm_start_info {
	uint32_t magic, version, flags, nr_modules;
	uint64_t modlist_paddr, cmdline_paddr, rsdp_paddr, memmap_paddr;
	uint32_t memmap_entries, reserved;
};
struct memmap_entry {
	uint64_t addr, size;
	uint32_t type, reserved;
};

#define DEV " virtio_mmio.device=4K@0xd0000000:5"

static void default_host(void)
{
	memset(&hcfg, 0, sizeof(hcfg));
	hcfg.device_id = 19;
	hcfg.version = 2;
	hcfg.qmax = 256;
	hcfg.event_idx = true;
	hcfg.cid = 3;
	hcfg.host_buf_alloc = 256 * 1024;
	hcfg.corrupt_at = -1;
	hcfg.conc = 1;
	hcfg.irq_pin = 5; /* DEV */
}

struct scenario {
	const char *name;
	const char *cmdline;
	void (*setup)(void);
	int want_exit;
	const char *want_out; /* substring, may be NULL */
};

static void s_hello(void)
{
	build_mp(fake_lowmem, 0x9fc00, 2, 1, false);
}

static void s_wrong_id(void)
{
	hcfg.device_id = 4;
}

static void s_no_v1(void)
{
	hcfg.no_version_1 = true;
}

static void s_small_queue(void)
{
	hcfg.qmax = 1;
}

static void s_bad_cid(void)
{
	hcfg.cid = 2;
}

static void echo_host(int n, int conc, uint64_t bytes, enum host_close how)
{
	hcfg.nconns = n;
	hcfg.conc = conc;
	hcfg.guest_port = 1234;
	hcfg.send_bytes = bytes;
	hcfg.expect_rx = bytes;
	hcfg.rx_kind = HR_ECHO;
	hcfg.close_kind = how;
}

static void s_echo40(void)
{
	echo_host(40, 40, 300 * 1024, HC_SHUT_BOTH);
	hcfg.host_buf_alloc = 64 * 1024;
}

static void s_echo_halfclose_slow(void)
{
	echo_host(4, 4, 1 << 20, HC_SHUT_SEND);
	hcfg.read_chunk = 4096;
	hcfg.stall_steps = 300;
	hcfg.host_buf_alloc = 32 * 1024;
	hcfg.credit_requests = true;
}

static void s_echo_rst(void)
{
	echo_host(3, 2, 100000, HC_RST);
}

static void s_echo_noevidx(void)
{
	echo_host(8, 8, 200000, HC_SHUT_BOTH);
	hcfg.event_idx = false;
	hcfg.qmax = 16;
	hcfg.read_chunk = 10000;
}

static void s_echo_many(void)
{
	echo_host(300, 120, 20000, HC_SHUT_SEND);
}

static void s_echo_overrun(void)
{
	echo_host(1, 1, 2 << 20, HC_SHUT_BOTH);
	hcfg.ignore_credit = true;
	hcfg.stall_steps = 1000000;
}

static void s_echo_big_buffers(void)
{
	echo_host(2, 2, 3 << 20, HC_SHUT_SEND);
}

static void connect_host(uint64_t bytes)
{
	hcfg.listen = true;
	hcfg.listen_port = 5000;
	hcfg.expect_rx = bytes;
	hcfg.host_buf_alloc = 32 * 1024;
	hcfg.read_chunk = 8192;
}

static void s_connect(void)
{
	connect_host(1 << 20);
}

static void s_connect_big(void)
{
	connect_host(10 << 20);
	hcfg.host_buf_alloc = 256 * 1024;
	hcfg.read_chunk = 0;
}

static void s_connect_noevidx(void)
{
	connect_host(3 << 20);
	hcfg.event_idx = false;
	hcfg.qmax = 32;
}

static void s_connect_stalled_host(void)
{
	connect_host(2 << 20);
	hcfg.stall_steps = 2000;
}

static void s_connect_corrupt(void)
{
	connect_host(1 << 20);
	hcfg.corrupt_at = 777777;
}

static void s_connect_refused(void)
{
	connect_host(1000);
	hcfg.refuse = true;
}

static void s_connect_no_listener(void)
{
	connect_host(1000);
	hcfg.listen_port = 5001;
}

static void s_connect_silent(void)
{
	connect_host(1000);
	hcfg.silent = true;
}

static void s_connect_early_rst(void)
{
	connect_host(1 << 20);
	hcfg.close_early = true;
}

static void s_connect_fault(enum fault f, uint64_t after)
{
	connect_host(1 << 20);
	hcfg.fault = f;
	hcfg.fault_after = after;
}
static void s_fault_rx_id(void) { s_connect_fault(F_RX_BAD_ID, 5); }
static void s_fault_rx_len(void) { s_connect_fault(F_RX_BAD_LEN, 5); }
static void s_fault_hdr_len(void) { s_connect_fault(F_RX_HDR_LEN, 5); }
static void s_fault_tx_id(void) { s_connect_fault(F_TX_BAD_ID, 5); }
static void s_fault_used_jump(void) { s_connect_fault(F_USED_IDX_JUMP, 5); }

static void s_fault_transport_reset(void) { s_connect_fault(F_TRANSPORT_RESET, 20); }

static void s_source_no_rst(void)
{
	hcfg.nconns = 2;
	hcfg.conc = 2;
	hcfg.guest_port = 7001;
	hcfg.expect_rx = 100000;
	hcfg.rx_kind = HR_PATTERN;
	hcfg.close_kind = HC_WAIT_GUEST;
	hcfg.no_rst_reply = true;
}

static void s_sink(void)
{
	hcfg.nconns = 5;
	hcfg.conc = 5;
	hcfg.guest_port = 7000;
	hcfg.send_bytes = 2 << 20;
	hcfg.close_kind = HC_SHUT_SEND;
}

static void s_sink_both(void)
{
	s_sink();
	hcfg.close_kind = HC_SHUT_BOTH;
}

static void s_source(void)
{
	hcfg.nconns = 3;
	hcfg.conc = 3;
	hcfg.guest_port = 7001;
	hcfg.expect_rx = 1 << 20;
	hcfg.rx_kind = HR_PATTERN;
	hcfg.close_kind = HC_WAIT_GUEST;
}

static void s_source_slow(void)
{
	s_source();
	hcfg.host_buf_alloc = 16 * 1024;
	hcfg.read_chunk = 5000;
	hcfg.stall_steps = 100;
}

static void s_irq_connect_lost(void)
{
	connect_host(64 << 10);
	hcfg.irq_drop = true;
}

static void s_irq_pvm(void)
{
	hcfg.pvm = true;
}

#define IRQ " testguest.irq=1"

static const struct scenario scenarios[] = {
	{ "hello", "testguest.mode=hello", s_hello, 0, "testguest: hello cpus=2\n" },
	{ "hello-no-tables", "testguest.mode=hello", NULL, 0, "testguest: hello cpus=1\n" },
	{ "fail", "testguest.mode=fail", NULL, 3, "testguest: fail mode" },
	{ "bad-cmdline", "testguest.mode=hello testguest.bogus=1", NULL, 8,
	  "bad command line: unknown parameter 'testguest.bogus'" },
	{ "no-mode", "console=ttyS0", NULL, 8, "no testguest.mode" },
	{ "irq-pvm", "testguest.mode=echo testguest.port=1" IRQ DEV, s_irq_pvm, 8,
	  "testguest: irq mode unsupported: CPL3 runs with IOPL 0" },
	{ "irq-hello", "testguest.mode=hello" IRQ, NULL, 0, "testguest: hello cpus=1\n" },
	{ "irq-pin-out-of-range",
	  "testguest.mode=echo testguest.port=1 virtio_mmio.device=4K@0xd0000000:24" IRQ, NULL, 8,
	  "device irq 24 is not a pin of the IOAPIC at 0xfec00000 (0-23)" },
	{ "irq-echo-40-concurrent",
	  "testguest.mode=echo testguest.port=1234 testguest.conns=40" IRQ DEV, s_echo40, 0,
	  "irq waits timed out 0, unsignalled 0\n" },
	{ "irq-echo-halfclose-slow-reader",
	  "testguest.mode=echo testguest.port=1234 testguest.conns=4" IRQ DEV,
	  s_echo_halfclose_slow, 0, "unsignalled 0\n" },
	{ "irq-echo-no-event-idx",
	  "testguest.mode=echo testguest.port=1234 testguest.conns=8" IRQ DEV, s_echo_noevidx, 0,
	  "unsignalled 0\n" },
	{ "irq-connect-10m", "testguest.mode=connect testguest.port=5000 testguest.bytes=10M" IRQ DEV,
	  s_connect_big, 0, "irq waits timed out 0, unsignalled 0\n" },
	{ "irq-connect-stalled-host",
	  "testguest.mode=connect testguest.port=5000 testguest.bytes=2M" IRQ DEV,
	  s_connect_stalled_host, 0, "unsignalled 0\n" },
	{ "irq-transport-reset",
	  "testguest.mode=connect testguest.port=5000 testguest.bytes=1M" IRQ DEV,
	  s_fault_transport_reset, 6, "transport reset, guest cid now 7" },
	{ "irq-source-slow-reader",
	  "testguest.mode=source testguest.port=7001 testguest.bytes=1M testguest.conns=3" IRQ DEV,
	  s_source_slow, 0, "unsignalled 0\n" },
	/* Every interrupt lost: the 100 ms wait limit still gets it done. */
	{ "irq-all-lost", "testguest.mode=connect testguest.port=5000 testguest.bytes=64K" IRQ DEV,
	  s_irq_connect_lost, 0, ", irqs 0 (no status 0)" },
	{ "no-device", "testguest.mode=echo testguest.port=1", NULL, 5, "no virtio-vsock device" },
	{ "wrong-device", "testguest.mode=echo testguest.port=1" DEV, s_wrong_id, 5,
	  "no virtio-vsock device" },
	{ "no-version-1", "testguest.mode=echo testguest.port=1" DEV, s_no_v1, 5, "lack required" },
	{ "queue-too-small", "testguest.mode=echo testguest.port=1" DEV, s_small_queue, 5,
	  "tx queue too small" },
	{ "bad-cid", "testguest.mode=echo testguest.port=1" DEV, s_bad_cid, 5, "guest_cid 2" },
	{ "echo-40-concurrent", "testguest.mode=echo testguest.port=1234 testguest.conns=40" DEV,
	  s_echo40, 0, "testguest: listening 1234\n" },
	{ "echo-halfclose-slow-reader",
	  "testguest.mode=echo testguest.port=1234 testguest.conns=4" DEV, s_echo_halfclose_slow, 0,
	  "echo done: 4 connections" },
	{ "echo-host-rst", "testguest.mode=echo testguest.port=1234 testguest.conns=3" DEV,
	  s_echo_rst, 0, "(peer reset)" },
	{ "echo-no-event-idx", "testguest.mode=echo testguest.port=1234 testguest.conns=8" DEV,
	  s_echo_noevidx, 0, "features 0x100000000" },
	{ "echo-300-conns-120-at-once",
	  "testguest.mode=echo testguest.port=1234 testguest.conns=300" DEV, s_echo_many, 0,
	  "echo done: 300 connections" },
	{ "echo-credit-overrun", "testguest.mode=echo testguest.port=1234 testguest.conns=1" DEV,
	  s_echo_overrun, 4, "peer overran our credit" },
	{ "echo-64k-buffers",
	  "testguest.mode=echo testguest.port=1234 testguest.conns=2 testguest.bufsize=65536" DEV,
	  s_echo_big_buffers, 0, "echo done" },
	{ "connect-1m", "testguest.mode=connect testguest.port=5000 testguest.bytes=1M" DEV,
	  s_connect, 0, "connect ok: 1048576 bytes" },
	{ "connect-10m", "testguest.mode=connect testguest.port=5000 testguest.bytes=10M" DEV,
	  s_connect_big, 0, "connect ok" },
	{ "connect-no-event-idx",
	  "testguest.mode=connect testguest.port=5000 testguest.bytes=3M" DEV, s_connect_noevidx, 0,
	  "connect ok" },
	{ "connect-stalled-host",
	  "testguest.mode=connect testguest.port=5000 testguest.bytes=2M" DEV,
	  s_connect_stalled_host, 0, "connect ok" },
	{ "connect-zero-bytes", "testguest.mode=connect testguest.port=5000 testguest.bytes=0" DEV,
	  s_connect_refused, 6, "refused" },
	{ "connect-corrupt", "testguest.mode=connect testguest.port=5000 testguest.bytes=1M" DEV,
	  s_connect_corrupt, 4, "mismatch at byte 777777" },
	{ "connect-refused", "testguest.mode=connect testguest.port=5000 testguest.bytes=1000" DEV,
	  s_connect_refused, 6, "refused" },
	{ "connect-no-listener",
	  "testguest.mode=connect testguest.port=5000 testguest.bytes=1000" DEV,
	  s_connect_no_listener, 6, "refused" },
	{ "connect-silent-timeout",
	  "testguest.mode=connect testguest.port=5000 testguest.bytes=1000 testguest.timeout=2" DEV,
	  s_connect_silent, 7, "timeout" },
	{ "connect-host-reset", "testguest.mode=connect testguest.port=5000 testguest.bytes=1M" DEV,
	  s_connect_early_rst, 6, "peer reset" },
	{ "fault-rx-used-id", "testguest.mode=connect testguest.port=5000 testguest.bytes=1M" DEV,
	  s_fault_rx_id, 4, "queue 0 used id 259 out of range" },
	{ "fault-rx-used-len", "testguest.mode=connect testguest.port=5000 testguest.bytes=1M" DEV,
	  s_fault_rx_len, 4, "rx used len" },
	{ "fault-rx-header-len",
	  "testguest.mode=connect testguest.port=5000 testguest.bytes=1M" DEV, s_fault_hdr_len, 4,
	  "rx header len" },
	{ "fault-tx-used-id", "testguest.mode=connect testguest.port=5000 testguest.bytes=1M" DEV,
	  s_fault_tx_id, 4, "tx used id" },
	{ "fault-used-idx-jump",
	  "testguest.mode=connect testguest.port=5000 testguest.bytes=1M" DEV, s_fault_used_jump, 4,
	  "used idx" },
	{ "transport-reset", "testguest.mode=connect testguest.port=5000 testguest.bytes=1M" DEV,
	  s_fault_transport_reset, 6, "transport reset, guest cid now 7" },
	{ "source-no-rst-after-shutdown",
	  "testguest.mode=source testguest.port=7001 testguest.bytes=100000 testguest.conns=2 "
	  "testguest.timeout=4" DEV,
	  s_source_no_rst, 0, "no RST after our SHUTDOWN: resetting" },
	{ "sink-halfclose", "testguest.mode=sink testguest.port=7000 testguest.conns=5" DEV, s_sink,
	  0, "sink done: 5 connections" },
	{ "sink-shutdown-both", "testguest.mode=sink testguest.port=7000 testguest.conns=5" DEV,
	  s_sink_both, 0, "sink done: 5 connections" },
	{ "source", "testguest.mode=source testguest.port=7001 testguest.bytes=1M testguest.conns=3" DEV,
	  s_source, 0, "source done: 3 connections" },
	{ "source-slow-reader",
	  "testguest.mode=source testguest.port=7001 testguest.bytes=1M testguest.conns=3" DEV,
	  s_source_slow, 0, "source done" },
};

static void child(const struct scenario *s)
{
	static struct hvm_start_info si;
	static struct memmap_entry mm[2];
	static char cmdline[1024];
	alarm(120);
	default_host();
	memset(fake_lowmem, 0, sizeof(fake_lowmem));
	if (s->setup)
		s->setup();
	strcpy(cmdline, s->cmdline);
	uint64_t heap = host_image_end();
	mm[0] = (struct memmap_entry){ 0, 0x9fc00, 1, 0 };
	mm[1] = (struct memmap_entry){ heap, 64u << 20, 1, 0 };
	si.magic = 0x336ec578;
	si.version = 1;
	si.cmdline_paddr = (uint64_t)(uintptr_t)cmdline;
	si.memmap_paddr = (uint64_t)(uintptr_t)mm;
	si.memmap_entries = 2;
	fake_reset();
	tg_main((uint64_t)(uintptr_t)&si);
	printf("tg_main returned\n");
	_exit(99);
}

static void run_scenario(const struct scenario *s)
{
	int fd[2];
	if (pipe(fd) != 0)
		abort();
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		close(fd[0]);
		dup2(fd[1], 1);
		child(s);
	}
	close(fd[1]);
	static char out[1 << 20];
	size_t n = 0;
	ssize_t r;
	while ((r = read(fd[0], out + n, sizeof(out) - 1 - n)) > 0)
		n += (size_t)r;
	out[n] = '\0';
	close(fd[0]);
	int status;
	waitpid(pid, &status, 0);
	int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	bool ok = code == s->want_exit && (!s->want_out || strstr(out, s->want_out));
	checks++;
	if (!ok)
		failures++;
	printf("%s scenario %-28s exit %d (want %d)\n", ok ? "ok  " : "FAIL", s->name, code,
	       s->want_exit);
	if (!ok || verbose) {
		/* The last lines tell the story. */
		const char *tail = out;
		if (n > 3000 && !verbose)
			tail = out + n - 3000;
		printf("---- console%s ----\n%s---- end ----\n", tail != out ? " (tail)" : "", tail);
		if (s->want_out && !strstr(out, s->want_out))
			printf("missing: '%s'\n", s->want_out);
	}
}

static int boot_dump(const char *path, const char *addr)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		perror(path);
		return 2;
	}
	size_t n = fread(fake_lowmem, 1, sizeof(fake_lowmem), f);
	fclose(f);
	printf("loaded %zu bytes of low memory; start_info at %s\n", n, addr);
	fflush(stdout);
	default_host();
	fake_reset();
	tg_main(strtoull(addr, NULL, 0));
	return 99;
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "-boot") == 0)
		return boot_dump(argv[2], argv[3]);
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-v") == 0)
			verbose = true;
		else
			only = argv[i];
	}
	if (!only) {
		test_format();
		test_cmdline();
		test_tables();
		test_mem();
		test_credit();
		test_pattern();
		printf("unit checks: %d, failures: %d\n", checks, failures);
	}
	for (size_t i = 0; i < ARRAY_SIZE(scenarios); i++)
		if (!only || strstr(scenarios[i].name, only))
			run_scenario(&scenarios[i]);
	printf("%s: %d checks, %d failures\n", failures ? "FAIL" : "PASS", checks, failures);
	return failures ? 1 : 0;
}
