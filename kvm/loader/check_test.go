package loader

import (
	"errors"
	"strings"
	"testing"
)

// TestCheck: Check tells the formats apart and rejects what Load would
// reject from the headers alone, with the same one-line "kernel NAME: ..."
// messages, and needs no guest memory.
func TestCheck(t *testing.T) {
	elf64 := defaultPVH()
	elf64.notes, elf64.notePhdr = nil, false
	elf32 := defaultPVH()
	elf32.class32, elf32.notes, elf32.notePhdr = true, nil, false
	elf32.entry = 0x1000000
	elf32.segs[0].vaddr = 0x1000000
	tests := []struct {
		name    string
		data    []byte
		want    Kind
		wantErr error
	}{
		{"bzImage", makeBzImage(defaultBz()), BzImage, nil},
		{"PVH ELF", makeELF(defaultPVH()), PVH, nil},
		{"plain ELF64", makeELF(elf64), ELF64, nil},
		{"ELF32 without PVH note", makeELF(elf32), 0, ErrUnsupported},
		{"text", []byte("#!/bin/sh\n"), 0, ErrUnknownFormat},
		{"empty", nil, 0, ErrConfig},
		{"bzImage magic only", append(make([]byte, 0x202), "HdrS"...), 0, ErrMalformed},
		{"truncated ELF", makeELF(defaultPVH())[:40], 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Check(BytesImage("k", tc.data))
			if tc.name == "truncated ELF" {
				if err == nil {
					t.Fatal("accepted a truncated ELF")
				}
				return
			}
			if !errors.Is(err, tc.wantErr) || got != tc.want {
				t.Fatalf("Check = %v, %v; want %v, %v", got, err, tc.want, tc.wantErr)
			}
			if err != nil && (!strings.HasPrefix(err.Error(), "kernel k: ") || strings.Contains(err.Error(), "\n")) {
				t.Errorf("error %q: want one line starting with \"kernel k: \"", err)
			}
		})
	}
}
