package boxtest

import (
	"debug/elf"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Kernel symbols for a boot stall's evidence: the vCPUs' instruction
// pointers in Machine.WaitAgent's line name functions of the guest kernel,
// whose vmlinux (build/kernel/vmlinux, linked without KASLR) the box-test
// stage has beside the bzImage the tests boot. Where the kernel stopped is
// then in CI's log, not only an address.

// kernelSymbols are a vmlinux's function symbols, by address.
type kernelSymbols struct {
	addrs []uint64
	names []string
}

// loadKernelSymbols reads the function symbols of the ELF file at path.
func loadKernelSymbols(path string) (*kernelSymbols, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	sort.Slice(syms, func(i, j int) bool { return syms[i].Value < syms[j].Value })
	k := &kernelSymbols{}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Value == 0 {
			continue
		}
		k.addrs = append(k.addrs, s.Value)
		k.names = append(k.names, s.Name)
	}
	return k, nil
}

// name is "function+0xoff" for addr, or "" when addr lies before the first
// function.
func (k *kernelSymbols) name(addr uint64) string {
	i := sort.Search(len(k.addrs), func(i int) bool { return k.addrs[i] > addr }) - 1
	if i < 0 {
		return ""
	}
	return fmt.Sprintf("%s+%#x", k.names[i], addr-k.addrs[i])
}

// vcpuRIP is one vCPU's part of Machine.WaitAgent's line.
var vcpuRIP = regexp.MustCompile(`vCPU (\d+) rip=(0x[0-9a-f]+)[^;\]]*?(halted|runnable)?[;\]]`)

// StallEvidence names, for a boot stall's output, where each vCPU was:
// "vCPU 0 default_idle+0x1a (halted); vCPU 1 ...", from the last
// agent-timeout line, the addresses looked up in the kernel at vmlinux.
// It is "" when out has no such line or vmlinux cannot be read.
func StallEvidence(out []byte, vmlinux string) string {
	locs := bootStall.FindAllIndex(out, -1)
	if len(locs) == 0 {
		return ""
	}
	end := len(out)
	if nl := strings.IndexByte(string(out[locs[len(locs)-1][0]:]), '\n'); nl >= 0 {
		end = locs[len(locs)-1][0] + nl
	}
	line := out[locs[len(locs)-1][0]:end]
	k, err := loadKernelSymbols(vmlinux)
	if err != nil {
		return ""
	}
	var parts []string
	for _, m := range vcpuRIP.FindAllSubmatch(line, -1) {
		rip, err := strconv.ParseUint(string(m[2]), 0, 64)
		if err != nil {
			continue
		}
		where := k.name(rip)
		if where == "" {
			where = string(m[2])
		}
		p := "vCPU " + string(m[1]) + " " + where
		if len(m[3]) > 0 {
			p += " (" + string(m[3]) + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}
