package benchstat

import (
	"math"
	"testing"

	"github.com/microvm/microvm/bench/internal/benchenv"
)

func TestPercentile(t *testing.T) {
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(i + 1) // 1..100
	}
	twenty := hundred[:20:20] // 1..20
	tests := []struct {
		name   string
		sorted []float64
		p      float64
		want   float64
	}{
		{"one sample", []float64{7}, 0.99, 7},
		{"p99 of 100 is the 99th", hundred, 0.99, 99},
		{"p90 of 100 is the 90th", hundred, 0.90, 90},
		{"p100 is the max", hundred, 1, 100},
		{"tiny p is the min", hundred, 0.001, 1},
		{"p99 of 20 is the max", twenty, 0.99, 20},
		{"p90 of 20 is the 18th", twenty, 0.90, 18},
		{"p50 of 20 is the 10th (nearest rank)", twenty, 0.5, 10},
		{"p99 of 3 is the max", []float64{1, 2, 3}, 0.99, 3},
		{"p99 of 5 is the max", []float64{1, 2, 3, 4, 5}, 0.99, 5},
		{"p50 of 4 is the 2nd (nearest rank)", []float64{1, 2, 3, 4}, 0.5, 2},
		{"p90 of 10 is the 9th", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.9, 9},
		{"p99 of 101 is the 100th", append(hundred[:100:100], 101), 0.99, 100},
	}
	for _, tc := range tests {
		if got := Percentile(tc.sorted, tc.p); got != tc.want {
			t.Errorf("%s: Percentile(%d samples, %v) = %v, want %v", tc.name, len(tc.sorted), tc.p, got, tc.want)
		}
	}
}

func TestSummarise(t *testing.T) {
	in := []float64{30, 10, 40, 20}
	got := Summarise(in)
	want := Summary{N: 4, P50: 25, P90: 40, P99: 40, Min: 10, Max: 40, Mean: 25}
	if got != want {
		t.Errorf("Summarise(%v):\n got %+v\nwant %+v", in, got, want)
	}
	if in[0] != 30 || in[1] != 10 {
		t.Errorf("Summarise sorted its input: %v", in)
	}
	odd := Summarise([]float64{5, 1, 3})
	if odd.P50 != 3 || odd.Min != 1 || odd.Max != 5 {
		t.Errorf("odd count: got %+v, want median 3 of 1..5", odd)
	}
	empty := Summarise(nil)
	if empty.N != 0 || !math.IsNaN(float64(empty.P50)) || !math.IsNaN(float64(empty.P99)) || !math.IsNaN(float64(empty.Mean)) {
		t.Errorf("no samples: got %+v, want N 0 and NaN figures", empty)
	}
}

func TestRatio(t *testing.T) {
	nan := benchenv.Num(math.NaN())
	tests := []struct {
		a, b benchenv.Num
		want float64 // NaN: missing
	}{
		{10, 2, 5},
		{10, 4, 2.5},
		{1, 4, 0.25},
		{1, 0, math.NaN()},
		{nan, 1, math.NaN()},
		{1, nan, math.NaN()},
	}
	for _, tc := range tests {
		got := float64(Ratio(tc.a, tc.b))
		if got != tc.want && !(math.IsNaN(got) && math.IsNaN(tc.want)) {
			t.Errorf("Ratio(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestFmtNum(t *testing.T) {
	tests := []struct {
		n    benchenv.Num
		want string
	}{
		{benchenv.Num(math.NaN()), "-"},
		{benchenv.Num(math.Inf(1)), "-"},
		{0, "0.000"},
		{0.0423, "0.042"},
		{1.234, "1.23"},
		{99.994, "99.99"},
		{123.45, "123.5"}, // 123.45 is a hair above in binary
		{12345.67, "12345.7"},
	}
	for _, tc := range tests {
		if got := FmtNum(tc.n); got != tc.want {
			t.Errorf("FmtNum(%v) = %q, want %q", float64(tc.n), got, tc.want)
		}
	}
}
