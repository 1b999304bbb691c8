package ratelimit

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratesync/ratelimit/shm"
	"github.com/ratesync/ratelimit/strategy"
)

type mode int

const (
	modeLocal mode = iota
	modeSync
	modeAsync
)

// Namespace counts hits for keys in sliding windows. Its methods are safe for
// concurrent use. Create one with Registry.New.
type Namespace struct {
	name   string
	cfg    Config
	mode   mode
	store  strategy.Strategy
	reg    *Registry
	log    *slog.Logger
	nodeID string
	seq    atomic.Uint64

	// tables[i/2] holds window size i at index i%2: an entry holds two sizes.
	tables []*shm.Table
	sizeMS []int64
	// nowMS reads the clock in Unix milliseconds: the default clock, which
	// reads it more cheaply than time.Now, or Config.Clock.
	nowMS func() int64

	// syncSem serialises sync cycles and fetches: at most one runs at a time.
	// A channel rather than a mutex, so a caller can stop waiting when its
	// context is done (Close must return by its deadline).
	syncSem   chan struct{}
	lastPurge time.Time
	// unresolved are pushes whose outcome is unknown, oldest first. They are
	// re-sent unchanged before any newer hit is pushed.
	unresMu    sync.Mutex
	unresolved []*push
	spare      *push // a settled cycle's push, reused for its buffers (under syncSem)

	stats stats
	// storeDown is set while the last sync cycle failed: answers from local
	// state are then marked Degraded in every mode.
	storeDown atomic.Bool

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
	ctx       context.Context // cancelled when Close gives up waiting
	cancel    context.CancelFunc
	done      chan struct{} // closed by Close to stop the loop
	trigger   chan struct{} // asks the loop for a cycle now (capacity 1, sends never block)
	loopDone  chan struct{}
}

func newNamespace(cfg Config, reg *Registry) (*Namespace, error) {
	var nowMS func() int64
	if cfg.Clock == nil {
		nowMS = newSystemClock().unixMilli
	}
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	if nowMS == nil {
		clock := cfg.Clock
		nowMS = func() int64 { return clock().UnixMilli() }
	}
	ns := &Namespace{name: cfg.Namespace, cfg: cfg, store: cfg.Strategy, reg: reg, log: cfg.Logger,
		nowMS: nowMS, trigger: make(chan struct{}, 1)}
	switch {
	case cfg.SyncRate < 0:
		ns.mode, ns.store = modeLocal, nil
	case cfg.SyncRate == 0:
		ns.mode = modeSync
	default:
		ns.mode = modeAsync
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	ns.nodeID = hex.EncodeToString(id[:])
	perTable := cfg.MaxKeys
	for i := 0; i < len(cfg.WindowSizes); i += 2 {
		sizes := cfg.WindowSizes[i:min(i+2, len(cfg.WindowSizes))]
		t, err := shm.New(shm.Options{Sizes: sizes, MaxKeys: perTable, Track: ns.mode != modeLocal,
			WriteThrough: ns.mode == modeSync, Settle: settleTime(cfg.SyncRate), ReadAhead: readAhead(ns.mode, cfg.MaxClockSkew), Walk: ns.mode == modeAsync,
			Pressure: ns.poke})
		if err != nil {
			return nil, fmt.Errorf("%w: WindowSizes: %w", ErrInvalidConfig, err)
		}
		ns.tables = append(ns.tables, t)
	}
	for _, w := range cfg.WindowSizes {
		ns.sizeMS = append(ns.sizeMS, w.Milliseconds())
	}
	ns.stats.decisions = make([]decisionCounters, len(cfg.WindowSizes)*decisionStripes)
	ns.ctx, ns.cancel = context.WithCancel(context.Background())
	ns.done = make(chan struct{})
	ns.syncSem = make(chan struct{}, 1)
	ns.loopDone = make(chan struct{})
	if ns.mode == modeLocal {
		close(ns.loopDone)
	} else {
		go ns.loop()
	}
	return ns, nil
}

// readAhead is how long before a window ends a periodic sync also reads the
// next one, to follow nodes whose clocks are ahead.
func readAhead(m mode, skew time.Duration) time.Duration {
	if m != modeAsync || skew < 0 {
		return 0
	}
	return skew
}

// settleTime is how long after a window ends the sync keeps reading it: three
// cycles, by when every node has pushed its last hits of it (capped, so a
// huge SyncRate cannot overflow).
func settleTime(syncRate time.Duration) time.Duration {
	if syncRate <= 0 {
		return 0
	}
	return 3 * min(syncRate, 24*time.Hour)
}

// poke asks the loop for a cycle now; it never blocks.
func (ns *Namespace) poke() {
	select {
	case ns.trigger <- struct{}{}:
	default:
	}
}

// Name returns the namespace's name.
func (ns *Namespace) Name() string { return ns.name }

// WindowSizes returns the namespace's window sizes.
func (ns *Namespace) WindowSizes() []time.Duration {
	return append([]time.Duration(nil), ns.cfg.WindowSizes...)
}

// now returns the clock's time in Unix milliseconds.
func (ns *Namespace) now() int64 { return ns.nowMS() }

// check validates a call's common arguments and returns the table and index
// of window, and the key to store (hashed when too long).
func (ns *Namespace) check(ctx context.Context, key string, window time.Duration) (*shm.Table, int, string, error) {
	if ctx == nil {
		return nil, 0, "", ErrNilContext
	}
	if ns.closed.Load() {
		return nil, 0, "", ErrClosed
	}
	if key == "" {
		return nil, 0, "", ErrInvalidKey
	}
	i, err := ns.windowIndex(window)
	if err != nil {
		return nil, 0, "", err
	}
	return ns.tables[i/2], i, ns.storedKey(key), nil
}

// windowIndex returns window's index in WindowSizes, or ErrUnknownWindow.
func (ns *Namespace) windowIndex(window time.Duration) (int, error) {
	for i, w := range ns.cfg.WindowSizes {
		if w == window {
			return i, nil
		}
	}
	return 0, fmt.Errorf("%w: %v (namespace %q has %v)", ErrUnknownWindow, window, ns.name, ns.cfg.WindowSizes)
}

// storedKey returns the key the tables hold for key: key itself, or a hash of
// it when it is longer than MaxKeyLength.
func (ns *Namespace) storedKey(key string) string {
	if len(key) > ns.cfg.MaxKeyLength {
		return hashKey(key)
	}
	return key
}

// hashKey replaces an over-long key by a fixed-length digest of it.
func hashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// Increment adds value (which may be negative) to key's counter for window and
// returns the key's sliding rate after the increment.
//
// In synchronous mode (SyncRate 0) the increment is written through to the
// store and the rate reflects the store's totals. If the store fails, the rate
// is computed from this node's state, the error matches ErrStoreUnavailable,
// and the hit is kept and pushed later: it is never lost.
func (ns *Namespace) Increment(ctx context.Context, key string, window time.Duration, value int64) (float64, error) {
	t, i, key, err := ns.check(ctx, key, window)
	if err != nil {
		return 0, err
	}
	if value > MaxValue || value < -MaxValue {
		return 0, fmt.Errorf("%w: %d is beyond ±2^53", ErrInvalidValue, value)
	}
	now := ns.now()
	if ns.mode == modeSync {
		return ns.through(ctx, t, i, key, now, value, true)
	}
	v := t.Add(key, i%2, now, value)
	return slidingRate(v.Cur, v.Prev, now, v.Start, ns.sizeMS[i]), nil
}

// SlidingWindow returns key's sliding rate for window without counting a hit.
// The key counts as seen by this node, so the next syncs read its cluster-wide
// total (fetch scope FetchSeen). In synchronous mode it reads the store.
func (ns *Namespace) SlidingWindow(ctx context.Context, key string, window time.Duration) (float64, error) {
	t, i, key, err := ns.check(ctx, key, window)
	if err != nil {
		return 0, err
	}
	now := ns.now()
	if ns.mode == modeSync {
		return ns.through(ctx, t, i, key, now, 0, false)
	}
	v := t.Peek(key, i%2, now)
	return slidingRate(v.Cur, v.Prev, now, v.Start, ns.sizeMS[i]), nil
}

// newBatchID returns an ID unique across nodes and restarts: a random node ID
// and a sequence number.
func (ns *Namespace) newBatchID() string {
	return ns.nodeID + "-" + strconv.FormatUint(ns.seq.Add(1), 36)
}

// Close stops the sync loop and pushes every unsynced hit before it returns.
// It is idempotent: later calls return the first call's result. Calls made
// after Close return ErrClosed. If the store cannot take the hits before ctx
// is done, Close returns an error matching ErrStoreUnavailable.
func (ns *Namespace) Close(ctx context.Context) error {
	if ctx == nil {
		return ErrNilContext
	}
	ns.closeOnce.Do(func() {
		ns.closed.Store(true)
		close(ns.done)
		select {
		case <-ns.loopDone:
		case <-ctx.Done():
			ns.cancel() // abort the cycle in flight
			<-ns.loopDone
		}
		if ns.mode != modeLocal {
			ns.closeErr = ns.flush(ctx)
		}
		ns.cancel()
		if ns.reg != nil {
			ns.reg.forget(ns)
		}
	})
	return ns.closeErr
}
