package main

import (
	"math"
	"slices"
	"time"

	"github.com/microvm/microvm/bench/internal/benchenv"
)

// num is a figure that encodes as JSON null when it could not be computed.
type num = benchenv.Num

// nan is the missing figure.
var nan = num(math.NaN())

// summary describes a row's samples. Every figure is NaN when there are
// none.
type summary struct {
	N int `json:"n"`
	// P50 is the median: the middle sample, or the mean of the middle two
	// for an even count.
	P50 num `json:"p50"`
	// P90 and P99 are nearest-rank percentiles: the smallest sample with
	// at least that fraction of the samples at or below it. With fewer
	// than 100 samples P99 is the maximum.
	P90  num `json:"p90"`
	P99  num `json:"p99"`
	Min  num `json:"min"`
	Max  num `json:"max"`
	Mean num `json:"mean"`
}

// summarise computes the summary of v, which it does not modify.
func summarise(v []float64) summary {
	if len(v) == 0 {
		return summary{P50: nan, P90: nan, P99: nan, Min: nan, Max: nan, Mean: nan}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	return summary{
		N:    len(s),
		P50:  num(median(s)),
		P90:  num(percentile(s, 0.90)),
		P99:  num(percentile(s, 0.99)),
		Min:  num(s[0]),
		Max:  num(s[len(s)-1]),
		Mean: num(sum / float64(len(s))),
	}
}

// median of sorted, which is not empty.
func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// percentile is the nearest-rank p-quantile (0 < p <= 1) of sorted, which
// is not empty: the sample at rank ceil(p*n), counting from 1.
func percentile(sorted []float64, p float64) float64 {
	// p*n is computed in floating point: 0.99*100 comes out a hair above
	// 99, which would move the rank up one. Round it to a millionth first.
	rank := int(math.Ceil(math.Round(p*float64(len(sorted))*1e6) / 1e6))
	return sorted[max(0, min(rank-1, len(sorted)-1))]
}

// ratio is a/b, NaN when either is missing or b is 0.
func ratio(a, b num) num {
	if math.IsNaN(float64(a)) || math.IsNaN(float64(b)) || b == 0 {
		return nan
	}
	return a / b
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return benchenv.MS(d) }

// mib is n bytes in MiB.
func mib(n int64) num { return num(float64(n) / (1 << 20)) }
