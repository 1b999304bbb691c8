package policy

import (
	"context"
	"fmt"
	"sync"
)

// MemoryStore is a Store in memory, for tests and single-process use. Many
// watchers (nodes) in one process can share one.
type MemoryStore struct {
	mu       sync.Mutex
	versions [][]byte                   // GUARDED_BY(mu); version n is versions[n-1]
	current  int64                      // GUARDED_BY(mu)
	subs     map[chan struct{}]struct{} // GUARDED_BY(mu)
	quiet    bool                       // GUARDED_BY(mu)
}

// SetQuiet makes Append and SetCurrent skip notifying, or notify again: a
// lost notification, for tests of the polling fallback.
func (m *MemoryStore) SetQuiet(quiet bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.quiet = quiet
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{subs: map[chan struct{}]struct{}{}}
}

// Current implements Store.
func (m *MemoryStore) Current(context.Context) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.current, nil
}

// Get implements Store.
func (m *MemoryStore) Get(_ context.Context, n int64) (Version, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n < 1 || n > int64(len(m.versions)) {
		return Version{}, fmt.Errorf("%w: %d", ErrNoVersion, n)
	}
	return Version{Number: n, Doc: m.versions[n-1]}, nil
}

// Versions implements Store.
func (m *MemoryStore) Versions(context.Context) ([]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	vs := make([]int64, len(m.versions))
	for i := range vs {
		vs[i] = int64(i + 1)
	}
	return vs, nil
}

// Append implements Store.
func (m *MemoryStore) Append(_ context.Context, doc []byte) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.versions = append(m.versions, append([]byte(nil), doc...))
	m.current = int64(len(m.versions))
	m.notify()
	return m.current, nil
}

// SetCurrent implements Store.
func (m *MemoryStore) SetCurrent(_ context.Context, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n < 1 || n > int64(len(m.versions)) {
		return fmt.Errorf("%w: %d", ErrNoVersion, n)
	}
	m.current = n
	m.notify()
	return nil
}

// notify requires m.mu.
func (m *MemoryStore) notify() {
	if m.quiet {
		return
	}
	for c := range m.subs {
		select {
		case c <- struct{}{}:
		default: // one pending notification is enough
		}
	}
}

// Subscribe implements Store.
func (m *MemoryStore) Subscribe(ctx context.Context) (<-chan struct{}, error) {
	c := make(chan struct{}, 1)
	m.mu.Lock()
	m.subs[c] = struct{}{}
	m.mu.Unlock()
	context.AfterFunc(ctx, func() {
		m.mu.Lock()
		delete(m.subs, c)
		m.mu.Unlock()
	})
	return c, nil
}
