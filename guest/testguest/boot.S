/*
 * boot.S - PVH entry, the CPL0 part of the test guest.
 *
 * The VMM enters pvh_entry in 32-bit protected mode, paging off, with %ebx
 * holding the physical address of struct hvm_start_info. We do the minimum
 * at CPL0 (on PVM hosts CPL0 code is emulated, slowly): load our GDT, turn
 * on long mode with static identity page tables, install a TSS and an IDT,
 * then iretq to user_start at CPL3 with IOPL=3 and IF=0. Everything else,
 * port I/O included, runs at CPL3.
 *
 * testguest.irq=1 (irq.h) adds two gates, live only once CPL3 sets
 * tg_irq_armed: vector IRQ_VECTOR runs the device interrupt handler
 * tg_irq() here at CPL0, and CPL3 executes `int $IRQ_ENABLE_VECTOR` (a DPL3
 * gate) to have its RFLAGS.IF set on the way back.
 *
 * Selectors: 0x08 kernel code64, 0x10 kernel data, 0x1b user data,
 * 0x23 user code64, 0x28 TSS (16 bytes).
 */

#define KERNEL_CS 0x08
#define KERNEL_DS 0x10
#define USER_DS (0x18 | 3)
#define USER_CS (0x20 | 3)
#define TSS_SEL 0x28

#define MSR_EFER 0xc0000080
#define EFER_LME (1 << 8)
#define CR0_PE 1
#define CR0_PG (1 << 31)
#define CR4_PAE (1 << 5)

/* RFLAGS for CPL3: IOPL=3, reserved bit 1, IF=0. */
#define USER_RFLAGS 0x3002
#define RFLAGS_IF 0x200

#include "irq.h"
#define IRQ_VECTOR TG_IRQ_VECTOR
#define IRQ_ENABLE_VECTOR TG_IRQ_ENABLE_VECTOR

/* IDT gate attributes: present 64-bit interrupt gate, DPL0 or DPL3. */
#define GATE_DPL0 0x8e00
#define GATE_DPL3 0xee00

/* Page-directory entry bits. */
#define PTE_P 0x01
#define PTE_RW 0x02
#define PTE_US 0x04
#define PTE_PWT 0x08
#define PTE_PCD 0x10
#define PTE_PS 0x80

#define XEN_ELFNOTE_PHYS32_ENTRY 18

	/*
	 * PVH entry note. ELF64 notes carry a pointer-sized value (as Linux's
	 * vmlinux does); a loader reading only 32 bits gets the same address.
	 * The section is 4-aligned so the PT_NOTE segment's p_align is 4,
	 * which QEMU uses to pad the name.
	 */
	.section .note.Xen, "a"
	.balign 4
	.long 4				/* namesz */
	.long 8				/* descsz */
	.long XEN_ELFNOTE_PHYS32_ENTRY
	.asciz "Xen"
	.quad pvh_entry

	.section .text.boot, "ax"
	.code32
	.globl pvh_entry
pvh_entry:
	cli
	cld
	mov %ebx, %esi			/* keep hvm_start_info in esi */

	lgdt gdt_ptr
	mov $KERNEL_DS, %eax
	mov %eax, %ds
	mov %eax, %es
	mov %eax, %ss
	mov %eax, %fs
	mov %eax, %gs

	mov %cr4, %eax
	or $CR4_PAE, %eax
	mov %eax, %cr4

	mov $pml4, %eax
	mov %eax, %cr3

	mov $MSR_EFER, %ecx
	rdmsr
	or $EFER_LME, %eax
	wrmsr

	mov %cr0, %eax
	or $(CR0_PG | CR0_PE), %eax
	mov %eax, %cr0

	ljmp $KERNEL_CS, $long_entry

	.code64
long_entry:
	mov $KERNEL_DS, %eax
	mov %eax, %ds
	mov %eax, %es
	mov %eax, %ss
	xor %eax, %eax
	mov %eax, %fs
	mov %eax, %gs
	mov $kstack_top, %esp
	mov %esi, %esi			/* zero-extend the start_info pointer */

	/* TSS: all zero except rsp0 and an I/O map base past the limit. */
	mov $tss, %edi
	xor %eax, %eax
	mov $(104 / 4), %ecx
	rep stosl
	mov $kstack_top, %eax
	mov %rax, tss + 4
	movw $104, tss + 102
	/* I/O permission bitmap right after: all ports allowed, 0xff end. */
	mov $(tss + 104), %edi
	xor %eax, %eax
	mov $(8192 / 4), %ecx
	rep stosl
	movb $0xff, tss + 104 + 8192

	/* 64-bit available TSS descriptor, limit 103. */
	mov $tss, %eax
	mov %eax, %edx
	shl $16, %rdx			/* base[15:0] -> bits 16..31 */
	or $(104 + 8192), %rdx		/* limit[15:0] */
	mov %eax, %ecx
	shr $16, %ecx
	and $0xff, %ecx
	shl $32, %rcx			/* base[23:16] -> bits 32..39 */
	or %rcx, %rdx
	mov $0x89, %ecx			/* P=1 DPL=0 type=9 */
	shl $40, %rcx
	or %rcx, %rdx
	mov %eax, %ecx
	shr $24, %ecx
	shl $56, %rcx			/* base[31:24] -> bits 56..63 */
	or %rcx, %rdx
	mov %rdx, gdt + TSS_SEL
	movq $0, gdt + TSS_SEL + 8
	mov $TSS_SEL, %eax
	ltr %ax

	/* IDT: vector v -> isr_stubs + 16*v, interrupt gate, DPL0. */
	mov $idt, %edi
	mov $isr_stubs, %eax
	mov $256, %ecx
1:	mov $GATE_DPL0, %edx
	call set_gate
	add $16, %eax
	add $16, %rdi
	dec %ecx
	jnz 1b
	/* The irq-mode gates (inert until tg_irq_armed is set). */
	mov $(idt + 16 * IRQ_VECTOR), %edi
	mov $irq_entry, %eax
	mov $GATE_DPL0, %edx
	call set_gate
	mov $(idt + 16 * IRQ_ENABLE_VECTOR), %edi
	mov $irq_enable_entry, %eax
	mov $GATE_DPL3, %edx
	call set_gate
	lidt idt_ptr

	/*
	 * Read the hypervisor timing leaf (0x40000010: TSC kHz) here at CPL0.
	 * At CPL3 CPUID is not necessarily virtualised: a PVM host runs guest
	 * user code natively, and CPUID there reports the host CPU's leaves.
	 */
	mov $0x40000000, %eax
	xor %ecx, %ecx
	cpuid
	cmp $0x40000010, %eax
	jb 1f
	cmp $0x40010000, %eax
	jae 1f
	mov $0x40000010, %eax
	xor %ecx, %ecx
	cpuid
	mov %eax, hv_tsc_khz
1:
	/* Drop to CPL3: the start_info pointer travels in %rdi. */
	mov %rsi, %rdi
	pushq $USER_DS
	pushq $ustack_top
	pushq $USER_RFLAGS
	pushq $USER_CS
	pushq $user_start
	iretq

	/* IDT entry at %rdi -> handler %eax (below 4 GiB), attributes %dx. */
set_gate:
	mov %ax, (%rdi)
	movw $KERNEL_CS, 2(%rdi)
	mov %dx, 4(%rdi)
	mov %eax, %edx
	shr $16, %edx
	mov %dx, 6(%rdi)
	movq $0, 8(%rdi)
	ret

	/*
	 * Exception and interrupt stubs. Nothing here is expected to run:
	 * interrupts stay off (but for irq mode's vector, below) and the guest
	 * never faults on purpose. If one does run, report the vector and exit
	 * with status 9.
	 */
	.balign 16
isr_stubs:
	.set vec, 0
	.rept 256
	.balign 16
	pushq $vec
	jmp isr_common
	.set vec, vec + 1
	.endr

isr_common:
	pop %rdi			/* vector */
	mov %rsp, %rsi			/* [error code,] rip, cs, rflags, rsp, ss */
	and $-16, %rsp
	call tg_exception
2:	jmp 2b

	/*
	 * irq mode: the device interrupt. From CPL3 the CPU has switched to
	 * the TSS's rsp0 and pushed ss, rsp, rflags, cs, rip; IF is 0 (an
	 * interrupt gate) until the iretq. Save the registers C may clobber,
	 * call tg_irq() on an aligned stack, restore, return.
	 */
irq_entry:
	cmpl $0, tg_irq_armed
	je 3f
	push %rax
	push %rcx
	push %rdx
	push %rsi
	push %rdi
	push %r8
	push %r9
	push %r10
	push %r11
	push %rbp
	mov %rsp, %rbp
	and $-16, %rsp
	cld
	call tg_irq
	mov %rbp, %rsp
	pop %rbp
	pop %r11
	pop %r10
	pop %r9
	pop %r8
	pop %rdi
	pop %rsi
	pop %rdx
	pop %rcx
	pop %rax
	iretq
3:	pushq $IRQ_VECTOR		/* not armed: an unexpected interrupt */
	jmp isr_common

	/* irq mode: `int $IRQ_ENABLE_VECTOR` from CPL3 returns with IF=1. */
irq_enable_entry:
	cmpl $0, tg_irq_armed
	je 4f
	orq $RFLAGS_IF, 16(%rsp)	/* the frame: rip, cs, rflags, rsp, ss */
	iretq
4:	pushq $IRQ_ENABLE_VECTOR
	jmp isr_common

	/* Written at CPL0 before .bss is cleared, so it lives in .data. */
	.data
	.balign 4
	.globl hv_tsc_khz
hv_tsc_khz:
	.long 0

	/* CPL3 from here on. */
	.text
	.globl user_start
user_start:
	mov %rdi, %r12
	mov $__bss_start, %edi
	mov $__bss_end, %ecx
	sub %edi, %ecx
	xor %eax, %eax
	rep stosb
	mov %r12, %rdi
	call tg_main
3:	mov $8, %al			/* tg_main returned: internal error */
	outb %al, $0xf4
	pause
	jmp 3b

	.section .rodata
	.balign 8
gdt_ptr:
	.word gdt_end - gdt - 1
	.quad gdt
idt_ptr:
	.word 256 * 16 - 1
	.quad idt

	.data
	.balign 16
gdt:
	.quad 0
	.quad 0x00af9a000000ffff	/* 0x08 kernel code64 */
	.quad 0x00cf92000000ffff	/* 0x10 kernel data */
	.quad 0x00cff2000000ffff	/* 0x18 user data, DPL3 */
	.quad 0x00affa000000ffff	/* 0x20 user code64, DPL3 */
	.quad 0, 0			/* 0x28 TSS, filled in at boot */
gdt_end:

	/*
	 * Identity map of [0, 4 GiB) with 2 MiB pages, User bit everywhere
	 * (the guest runs at CPL3). The top GiB holds the MMIO devices and is
	 * mapped uncached. Static data: no CPL0 loop builds it.
	 */
	.balign 4096
pml4:
	.quad pdpt + (PTE_P | PTE_RW | PTE_US)
	.fill 511, 8, 0
pdpt:
	.quad pd + 0x0000 + (PTE_P | PTE_RW | PTE_US)
	.quad pd + 0x1000 + (PTE_P | PTE_RW | PTE_US)
	.quad pd + 0x2000 + (PTE_P | PTE_RW | PTE_US)
	.quad pd + 0x3000 + (PTE_P | PTE_RW | PTE_US | PTE_PWT | PTE_PCD)
	.fill 508, 8, 0
pd:
	.set page, 0
	.rept 1536
	.quad (page << 21) + (PTE_P | PTE_RW | PTE_US | PTE_PS)
	.set page, page + 1
	.endr
	.rept 512
	.quad (page << 21) + (PTE_P | PTE_RW | PTE_US | PTE_PS | PTE_PWT | PTE_PCD)
	.set page, page + 1
	.endr

	/* Not cleared by user_start: in use before and during it. */
	.section .bootbss, "aw", @nobits
	.balign 4096
idt:
	.skip 256 * 16
	.balign 16
tss:
	.skip 104 + 8192 + 1
	.balign 16
	.skip 16384
kstack_top:
	.balign 16
	.skip 65536
	.globl ustack_top
ustack_top:

	.section .note.GNU-stack, "", @progbits
