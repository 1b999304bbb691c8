package policy

import "sync/atomic"

// Holder holds the snapshot in force. Readers never block and always see a
// whole snapshot: Store swaps one pointer.
type Holder struct {
	p atomic.Pointer[Snapshot]
}

// NewHolder returns a Holder holding s (which may be nil: no policy).
func NewHolder(s *Snapshot) *Holder {
	h := &Holder{}
	h.p.Store(s)
	return h
}

// Load returns the snapshot in force, or nil.
func (h *Holder) Load() *Snapshot { return h.p.Load() }

// Store puts s in force.
func (h *Holder) Store(s *Snapshot) { h.p.Store(s) }

// Provider gives the snapshot in force; Holder and Watcher are Providers.
// Load must be cheap and must not block: the middleware calls it on every
// request.
type Provider interface {
	Load() *Snapshot
}
