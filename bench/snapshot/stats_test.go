package main

import (
	"math"
	"testing"
)

func TestPercentile(t *testing.T) {
	twenty := make([]float64, 20)
	for i := range twenty {
		twenty[i] = float64(i + 1) // 1..20
	}
	tests := []struct {
		name   string
		sorted []float64
		p      float64
		want   float64
	}{
		{"one sample", []float64{7}, 0.99, 7},
		{"p99 of 20 is the max", twenty, 0.99, 20},
		{"p90 of 20 is the 18th", twenty, 0.90, 18},
		{"p50 of 20 is the 10th (nearest rank)", twenty, 0.5, 10},
		{"tiny p is the min", twenty, 0.001, 1},
		{"p99 of 5 is the max", []float64{1, 2, 3, 4, 5}, 0.99, 5},
	}
	for _, tc := range tests {
		if got := percentile(tc.sorted, tc.p); got != tc.want {
			t.Errorf("%s: percentile(%d samples, %v) = %v, want %v", tc.name, len(tc.sorted), tc.p, got, tc.want)
		}
	}
}

func TestSummarise(t *testing.T) {
	in := []float64{30, 10, 40, 20}
	got := summarise(in)
	want := summary{N: 4, P50: 25, P90: 40, P99: 40, Min: 10, Max: 40, Mean: 25}
	if got != want {
		t.Errorf("summarise(%v):\n got %+v\nwant %+v", in, got, want)
	}
	if in[0] != 30 || in[1] != 10 {
		t.Errorf("summarise sorted its input: %v", in)
	}
	empty := summarise(nil)
	if empty.N != 0 || !math.IsNaN(float64(empty.P50)) || !math.IsNaN(float64(empty.P99)) || !math.IsNaN(float64(empty.Mean)) {
		t.Errorf("no samples: got %+v, want N 0 and NaN figures", empty)
	}
}

func TestRatio(t *testing.T) {
	tests := []struct {
		a, b, want num
	}{
		{10, 4, 2.5},
		{1, 0, nan},
		{nan, 2, nan},
		{2, nan, nan},
	}
	for _, tc := range tests {
		got := ratio(tc.a, tc.b)
		if math.IsNaN(float64(tc.want)) != math.IsNaN(float64(got)) || !math.IsNaN(float64(got)) && got != tc.want {
			t.Errorf("ratio(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

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
