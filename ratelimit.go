package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Errors returned by the package. Match them with errors.Is.
var (
	// ErrNamespaceExists is returned by Registry.New when the registry already
	// holds a namespace of that name.
	ErrNamespaceExists = errors.New("ratelimit: namespace exists")
	// ErrInvalidConfig is returned (wrapped) by Registry.New when a Config
	// field is invalid; the message names the field.
	ErrInvalidConfig = errors.New("ratelimit: invalid config")
	// ErrUnknownWindow is returned when a call names a window size that is
	// not in the namespace's WindowSizes.
	ErrUnknownWindow = errors.New("ratelimit: unknown window size")
	// ErrInvalidKey is returned when a call is given an empty key.
	ErrInvalidKey = errors.New("ratelimit: invalid key")
	// ErrInvalidValue is returned by Increment when the value is outside
	// ±MaxValue.
	ErrInvalidValue = errors.New("ratelimit: invalid value")
	// ErrNilContext is returned when a call is given a nil context.Context.
	ErrNilContext = errors.New("ratelimit: nil context")
	// ErrClosed is returned by every call on a namespace or registry after
	// its Close.
	ErrClosed = errors.New("ratelimit: closed")
	// ErrStoreUnavailable is returned, wrapping the store's error, when a call
	// needed the store and could not use it. The answer that comes with it is
	// computed from this node's local state, and no hit is lost: it is pushed
	// later.
	ErrStoreUnavailable = errors.New("ratelimit: store unavailable")
)

// UnpushedError is the error of a Sync or Close that could not push every hit
// counted on this node: Hits says how many the store has not confirmed when
// the call returned. It wraps the store's error, so it also matches
// ErrStoreUnavailable. Hits that are not lost wait for a later push; after
// Close, they are lost.
type UnpushedError struct {
	Hits int64 // hits counted on this node that the store has not confirmed
	Err  error // why they could not be pushed
}

func (e *UnpushedError) Error() string {
	return fmt.Sprintf("ratelimit: %d hits not pushed: %v", e.Hits, e.Err)
}

func (e *UnpushedError) Unwrap() error { return e.Err }

// MaxValue bounds the magnitude of one increment. Rates are float64, exact up
// to 2^53; a larger value is rejected with ErrInvalidValue.
const MaxValue = 1 << 53

// Registry holds namespaces by name, like Kong's per-worker configuration table.
// Its methods are safe for concurrent use.
type Registry struct {
	mu     sync.Mutex
	spaces map[string]*Namespace
	closed bool
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry {
	return &Registry{spaces: make(map[string]*Namespace)}
}

// New defines a namespace from cfg and starts its sync loop when cfg.SyncRate
// is not negative. An empty cfg.Namespace means "default". Defining a name the
// registry already holds returns an error matching ErrNamespaceExists; an
// invalid cfg returns one matching ErrInvalidConfig that names the field.
func (r *Registry) New(cfg Config) (*Namespace, error) {
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	if _, ok := r.spaces[cfg.Namespace]; ok {
		return nil, fmt.Errorf("%w: %q", ErrNamespaceExists, cfg.Namespace)
	}
	ns, err := newNamespace(cfg, r)
	if err != nil {
		return nil, err
	}
	r.spaces[cfg.Namespace] = ns
	return ns, nil
}

// Namespace returns the namespace defined under name ("" means "default").
func (r *Registry) Namespace(name string) (*Namespace, bool) {
	if name == "" {
		name = DefaultNamespace
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ns, ok := r.spaces[name]
	return ns, ok
}

// Close closes every namespace (pushing their unsynced hits) and refuses new
// ones. It is idempotent; the error joins the namespaces' errors.
func (r *Registry) Close(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	spaces := make([]*Namespace, 0, len(r.spaces))
	for _, ns := range r.spaces {
		spaces = append(spaces, ns)
	}
	r.mu.Unlock()
	// In parallel: every namespace gets the whole of ctx's time to flush.
	errs := make([]error, len(spaces))
	var wg sync.WaitGroup
	for i, ns := range spaces {
		wg.Go(func() { errs[i] = ns.Close(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (r *Registry) forget(ns *Namespace) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.spaces[ns.name] == ns {
		delete(r.spaces, ns.name)
	}
}
