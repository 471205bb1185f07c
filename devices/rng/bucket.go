package rng

import "time"

// bucket is a token bucket counted in bytes: rate bytes accrue per second,
// up to burst. Owner: the worker goroutine.
type bucket struct {
	rate, burst uint64
	tokens      uint64
	last        time.Time
	// frac carries the sub-byte remainder of accrual between calls, in
	// byte-nanoseconds, so slow rates still accrue exactly.
	frac uint64
}

func newBucket(rate, burst uint64, now time.Time) *bucket {
	return &bucket{rate: rate, burst: burst, tokens: burst, last: now}
}

// refill adds the tokens accrued since the last call and returns the
// tokens the bucket holds.
func (b *bucket) refill(now time.Time) uint64 {
	if el := now.Sub(b.last); el > 0 {
		b.last = now
		// Cap the elapsed time at what refills an empty bucket, so
		// ns*rate stays below (burst+rate)*1e9 <= 2^31*1e9 (New bounds
		// both by MaxRate): no overflow.
		capNS := (b.burst/b.rate + 1) * uint64(time.Second)
		ns := min(uint64(el), capNS)
		acc := b.frac + ns*b.rate
		b.tokens = min(b.burst, b.tokens+acc/uint64(time.Second))
		b.frac = acc % uint64(time.Second)
		if b.tokens == b.burst {
			b.frac = 0
		}
	}
	return b.tokens
}

// wait is how long until the bucket holds need tokens (need <= burst),
// counted from the last refill.
func (b *bucket) wait(need uint64) time.Duration {
	if b.tokens >= need {
		return 0
	}
	ns := (need-b.tokens)*uint64(time.Second) - b.frac
	return time.Duration((ns + b.rate - 1) / b.rate)
}

// take spends n tokens (n <= what refill returned).
func (b *bucket) take(n uint64) { b.tokens -= min(n, b.tokens) }
