package main

import "testing"

func TestSizesFlag(t *testing.T) {
	var s sizesFlag
	if err := s.Set("4G, 256M,1G,0,1G"); err != nil {
		t.Fatal(err)
	}
	want := sizesFlag{0, 256 << 20, 1 << 30, 4 << 30}
	if len(s) != len(want) {
		t.Fatalf("Set: got %v, want %v", s, want)
	}
	for i := range want {
		if s[i] != want[i] {
			t.Errorf("Set: got %v, want %v (sorted, no repeats)", s, want)
		}
	}
	if got := s.String(); got != "0B,256M,1G,4G" {
		t.Errorf("String() = %q, want 0B,256M,1G,4G", got)
	}
	if err := s.Set("12Q"); err == nil {
		t.Error("Set(12Q): no error")
	}
	if err := s.Set(""); err != nil || len(s) != 0 {
		t.Errorf("Set(\"\") = %v, %v; want an empty list", s, err)
	}
}
