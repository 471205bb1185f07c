// Package benchstat summarises a benchmark row's samples (median,
// nearest-rank p90 and p99, min, max, mean), divides figures that may be
// missing, and prints figures for the tables. The benchmarks that share it
// (bench/exec, bench/snapshot) store its Summary in their JSON as is.
package benchstat

import (
	"math"
	"slices"
	"strconv"

	"github.com/microvm/microvm/bench/internal/benchenv"
)

// Summary describes a row's samples. Every figure is NaN when there are
// none.
type Summary struct {
	N int `json:"n"`
	// P50 is the median: the middle sample, or the mean of the middle two
	// for an even count.
	P50 benchenv.Num `json:"p50"`
	// P90 and P99 are nearest-rank percentiles: the smallest sample with
	// at least that fraction of the samples at or below it. With fewer
	// than 100 samples P99 is the maximum.
	P90  benchenv.Num `json:"p90"`
	P99  benchenv.Num `json:"p99"`
	Min  benchenv.Num `json:"min"`
	Max  benchenv.Num `json:"max"`
	Mean benchenv.Num `json:"mean"`
}

// Summarise computes the summary of v, which it does not modify.
func Summarise(v []float64) Summary {
	if len(v) == 0 {
		nan := benchenv.Num(math.NaN())
		return Summary{P50: nan, P90: nan, P99: nan, Min: nan, Max: nan, Mean: nan}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	return Summary{
		N:    len(s),
		P50:  benchenv.Num(Median(s)),
		P90:  benchenv.Num(Percentile(s, 0.90)),
		P99:  benchenv.Num(Percentile(s, 0.99)),
		Min:  benchenv.Num(s[0]),
		Max:  benchenv.Num(s[len(s)-1]),
		Mean: benchenv.Num(sum / float64(len(s))),
	}
}

// Median of sorted, which is not empty: the middle sample, or the mean of
// the middle two for an even count.
func Median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// Percentile is the nearest-rank p-quantile (0 < p <= 1) of sorted, which
// is not empty: the sample at rank ceil(p*n), counting from 1.
func Percentile(sorted []float64, p float64) float64 {
	// p*n is computed in floating point: 0.99*100 comes out a hair above
	// 99, which would move the rank up one. Round it to a millionth first.
	rank := int(math.Ceil(math.Round(p*float64(len(sorted))*1e6) / 1e6))
	return sorted[max(0, min(rank-1, len(sorted)-1))]
}

// Ratio is a/b, NaN when either is missing or b is 0.
func Ratio(a, b benchenv.Num) benchenv.Num {
	if math.IsNaN(float64(a)) || math.IsNaN(float64(b)) || b == 0 {
		return benchenv.Num(math.NaN())
	}
	return a / b
}

// FmtNum prints a figure with about three significant digits (one decimal
// from 100 up, two from 1, three below), or "-" when it is missing.
func FmtNum(n benchenv.Num) string {
	f := float64(n)
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0):
		return "-"
	case math.Abs(f) >= 100:
		return strconv.FormatFloat(f, 'f', 1, 64)
	case math.Abs(f) >= 1:
		return strconv.FormatFloat(f, 'f', 2, 64)
	}
	return strconv.FormatFloat(f, 'f', 3, 64)
}
