package main

import (
	"math"
	"time"

	"github.com/microvm/microvm/bench/internal/benchenv"
)

// num is a figure that encodes as JSON null when it could not be computed.
type num = benchenv.Num

// nan is the missing figure.
var nan = num(math.NaN())

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return benchenv.MS(d) }

// mib is n bytes in MiB.
func mib(n int64) num { return num(float64(n) / (1 << 20)) }
