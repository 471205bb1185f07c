package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"io"
	"math/rand/v2"
)

// Payloads are pseudo-random bytes from ChaCha8 keyed by the seed: the key is
// the seed as 8 little-endian bytes followed by 24 zero bytes. math/rand/v2
// documents ChaCha8's output as stable, so a host-side test can regenerate
// the exact bytes a guest scenario sends:
//
//	var key [32]byte
//	binary.LittleEndian.PutUint64(key[:], seed)
//	rand.NewChaCha8(key).Read(buf)
func newPayload(seed uint64) io.Reader {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	return rand.NewChaCha8(key)
}

// payloadSHA256 returns the hex SHA-256 of the first n bytes of seed's payload.
func payloadSHA256(seed uint64, n int64) string {
	d := newDigest()
	_, _ = io.CopyN(d, newPayload(seed), n) // neither side fails
	return d.Sum()
}

// digest counts and hashes the bytes written to it.
type digest struct {
	h hash.Hash
	n int64
}

func newDigest() *digest { return &digest{h: sha256.New()} }

func (d *digest) Write(p []byte) (int, error) {
	d.h.Write(p) // never fails
	d.n += int64(len(p))
	return len(p), nil
}

// Sum returns the hex SHA-256 of everything written so far.
func (d *digest) Sum() string { return hex.EncodeToString(d.h.Sum(nil)) }

// Len returns how many bytes were written.
func (d *digest) Len() int64 { return d.n }
