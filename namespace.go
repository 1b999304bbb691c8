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
	// buckets[i] and logs[i] hold the token buckets and sliding logs of
	// window size i, once a limit used them (kinds.go).
	buckets      []atomic.Pointer[shm.Buckets]
	logs         []atomic.Pointer[shm.Logs]
	kindMu       sync.Mutex // serialises their creation
	sealed       bool       // Close sealed the tables: new ones start sealed (guarded by kindMu)
	capabilities strategy.Capabilities
	// takes are synchronous-mode decisions to settle with the store (take.go).
	takeMu sync.Mutex
	takes  []*pendingTake // guarded by takeMu
	// droppedTakes counts the cost of queued Takes given up (maxPendingTakes).
	droppedTakes atomic.Int64
	sizeMS       []int64
	// nowMS reads the clock in Unix milliseconds: the default clock, which
	// reads it more cheaply than time.Now, or Config.Clock.
	nowMS func() int64
	tick  *tickClock // the default clock, nil when Config.Clock is set

	// syncSem serialises sync cycles and fetches: at most one runs at a time.
	// A channel rather than a mutex, so a caller can stop waiting when its
	// context is done (Close must return by its deadline).
	syncSem   chan struct{}
	lastPurge time.Time // when a sync cycle last called Purge; guarded by syncSem
	// unresolved are pushes whose outcome is unknown, oldest first. They are
	// re-sent unchanged before any newer hit is pushed.
	unresMu    sync.Mutex
	unresolved []*push // guarded by unresMu
	spare      *push   // a settled cycle's push, reused for its buffers (under syncSem)
	// passDiffs[i] is how many diffs table i's watched passes pushed in the
	// last regular cycle and the early ones before it: the next pass's
	// estimate of its own; cycleDiffs[i] counts them since (see syncTable).
	// Guarded by syncSem.
	passDiffs, cycleDiffs []int
	earlyCycle            bool // the cycle running was triggered by evictions (see runCycle); guarded by syncSem

	stats stats
	hot   *hotKeys    // nil unless Config.HotKeys is on
	cold  *coldReader // nil unless periodic mode reads cold keys first (coldread.go)
	// storeDown is set while the last sync cycle failed: answers from local
	// state are then marked Degraded in every mode.
	storeDown atomic.Bool
	// throughDown is set while synchronous-mode pushes fail; then a
	// write-through goes to the store only as the probe in flight (probing),
	// and the others answer from local state (see sendThrough).
	throughDown, probing atomic.Bool

	closed    atomic.Bool
	calls     [decisionStripes]callStripe // calls in flight, on a random stripe (see enter)
	closeOnce sync.Once
	closeErr  error           // written once inside closeOnce; read after it
	ctx       context.Context // cancelled when Close gives up waiting
	// closing is cancelled as soon as Close begins: calls waiting for a
	// cold read stop waiting (Close then waits for them to finish).
	closing    context.Context
	endClosing context.CancelFunc
	cancel     context.CancelFunc
	done       chan struct{} // closed by Close to stop the loop
	trigger    chan struct{} // asks the loop for a cycle now (capacity 1, sends never block)
	loopDone   chan struct{}
}

func newNamespace(cfg Config, reg *Registry) (*Namespace, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	nowMS, tick := cfg.clock()
	ns := &Namespace{name: cfg.Namespace, cfg: cfg, store: cfg.Strategy, reg: reg, log: cfg.Logger,
		nowMS: nowMS, tick: tick, trigger: make(chan struct{}, 1)}
	switch {
	case cfg.SyncRate < 0:
		ns.mode, ns.store = modeLocal, nil
	case cfg.SyncRate == 0:
		ns.mode = modeSync
	default:
		ns.mode = modeAsync
	}
	if ns.store != nil {
		ns.capabilities = strategy.CapabilitiesOf(ns.store)
	}
	ns.buckets = make([]atomic.Pointer[shm.Buckets], len(cfg.WindowSizes))
	ns.logs = make([]atomic.Pointer[shm.Logs], len(cfg.WindowSizes))
	ns.hot = newHotKeys(cfg.HotKeys, nowMS)
	ns.cold = newColdReader(ns)
	if cfg.Observer != nil && ns.store != nil {
		ns.store = &observedStore{inner: ns.store, obs: cfg.Observer, ns: cfg.Namespace}
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	ns.nodeID = hex.EncodeToString(id[:])
	perTable := cfg.MaxKeys
	for i := 0; i < len(cfg.WindowSizes); i += 2 {
		sizes := cfg.WindowSizes[i:min(i+2, len(cfg.WindowSizes))]
		t, err := shm.New(shm.Options{Sizes: sizes, MaxKeys: perTable, Track: ns.mode != modeLocal,
			WriteThrough: ns.mode == modeSync, Settle: settleTime(cfg.SyncRate), ReadAhead: readAhead(ns.mode, cfg.MaxClockSkew), Walk: ns.mode == modeAsync,
			Watch:    ns.mode == modeAsync && ns.capabilities.Watch && cfg.FetchScope == FetchSeen,
			Pressure: ns.poke})
		if err != nil {
			return nil, fmt.Errorf("%w: WindowSizes: %w", ErrInvalidConfig, err)
		}
		ns.tables = append(ns.tables, t)
	}
	ns.passDiffs, ns.cycleDiffs = make([]int, len(ns.tables)), make([]int, len(ns.tables))
	for _, w := range cfg.WindowSizes {
		ns.sizeMS = append(ns.sizeMS, w.Milliseconds())
	}
	ns.stats.decisions = make([]decisionCounters, len(cfg.WindowSizes)*decisionStripes)
	ns.ctx, ns.cancel = context.WithCancel(context.Background())
	ns.closing, ns.endClosing = context.WithCancel(context.Background())
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
	if i := ns.sizeIndex(window); i >= 0 {
		return i, nil
	}
	return 0, fmt.Errorf("%w: %v (namespace %q has %v)", ErrUnknownWindow, window, ns.name, ns.cfg.WindowSizes)
}

// sizeIndex returns window's index in the namespace's WindowSizes, or -1.
// It is small enough to inline into the hot path's checks (plainIndex).
func (ns *Namespace) sizeIndex(window time.Duration) int {
	for i, w := range ns.cfg.WindowSizes {
		if w == window {
			return i
		}
	}
	return -1
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
	if ns.mode == modeSync {
		return ns.incrementEntered(ctx, key, window, value)
	}
	// A key this node holds (or any key, without cold reads) is counted in
	// one table call that a sealed table refuses: the call need not
	// register as in flight (see Close).
	if ns.closed.Load() {
		return 0, closedOr(ctx)
	}
	t, i, stored, err := ns.checkIncrement(ctx, key, window, value)
	if err != nil {
		return 0, err
	}
	now := ns.now()
	v, held, open := t.AddOpen(stored, i%2, now, value, ns.cold != nil, true)
	switch {
	case !open:
		return 0, closedOr(ctx)
	case !held: // cold: read from the store first
		return ns.incrementEntered(ctx, key, window, value)
	}
	return slidingRate(v.Cur, v.Prev, now, v.Start, ns.sizeMS[i]), nil
}

// checkIncrement is check, and the check of Increment's value.
func (ns *Namespace) checkIncrement(ctx context.Context, key string, window time.Duration, value int64) (*shm.Table, int, string, error) {
	t, i, key, err := ns.check(ctx, key, window)
	if err != nil {
		return nil, 0, "", err
	}
	if value > MaxValue || value < -MaxValue {
		return nil, 0, "", fmt.Errorf("%w: %d is beyond ±2^53", ErrInvalidValue, value)
	}
	return t, i, key, nil
}

// incrementEntered is Increment as a call in flight, which Close waits for:
// in synchronous mode, and for a cold key (read from the store first).
func (ns *Namespace) incrementEntered(ctx context.Context, key string, window time.Duration, value int64) (float64, error) {
	s, open := ns.enter()
	if !open {
		return 0, closedOr(ctx)
	}
	defer leave(s)
	t, i, key, err := ns.checkIncrement(ctx, key, window, value)
	if err != nil {
		return 0, err
	}
	now := ns.now()
	if ns.mode == modeSync {
		return ns.through(ctx, t, i, key, now, value, true)
	}
	var v shm.View
	if ns.cold != nil { // a cold key is read from the store first (coldread.go)
		v, now = ns.applyWarm(ctx, t, i, key, now, value, false)
	} else {
		v = t.Add(key, i%2, now, value)
	}
	return slidingRate(v.Cur, v.Prev, now, v.Start, ns.sizeMS[i]), nil
}

// SlidingWindow returns key's sliding rate for window without counting a hit.
// The key counts as seen by this node, so the next syncs read its cluster-wide
// total (fetch scope FetchSeen). In synchronous mode it reads the store.
func (ns *Namespace) SlidingWindow(ctx context.Context, key string, window time.Duration) (float64, error) {
	s, open := ns.enter()
	if !open {
		return 0, closedOr(ctx)
	}
	defer leave(s)
	t, i, key, err := ns.check(ctx, key, window)
	if err != nil {
		return 0, err
	}
	now := ns.now()
	if ns.mode == modeSync {
		return ns.through(ctx, t, i, key, now, 0, false)
	}
	var v shm.View
	if ns.cold != nil {
		v, now = ns.applyWarm(ctx, t, i, key, now, 0, true)
	} else {
		v = t.Peek(key, i%2, now)
	}
	return slidingRate(v.Cur, v.Prev, now, v.Start, ns.sizeMS[i]), nil
}

// newBatchID returns an ID unique across nodes and restarts: a random node ID
// and a sequence number.
func (ns *Namespace) newBatchID() string {
	return ns.nodeID + "-" + strconv.FormatUint(ns.seq.Add(1), 36)
}

// Close stops the sync loop and pushes every unsynced hit before it returns.
// It is idempotent: later calls return the first call's result. Calls made
// after Close return ErrClosed; calls in flight when Close begins finish
// first, and their hits are pushed with the others (a synchronous-mode
// write-through still waiting on the store when ctx is done makes Close
// return an UnpushedError that counts its hits). Close returns nil only when
// it pushed every hit this node still held. Hits given up earlier to keep
// memory bounded (Stats.DroppedHits: retired windows past their cap while
// no push succeeded) were lost then, and Close does not report them again:
// read DroppedHits before or after Close to know. If the store cannot take
// the hits before ctx is done, Close returns by then with an error matching
// ErrStoreUnavailable, in which errors.As finds an *UnpushedError that says
// how many hits were not pushed.
func (ns *Namespace) Close(ctx context.Context) error {
	if ctx == nil {
		return ErrNilContext
	}
	ns.closeOnce.Do(func() {
		ns.closed.Store(true)
		ns.endClosing() // calls waiting for a cold read answer now
		// Calls that found the namespace open finish first, so the flush
		// collects every hit a call reported counted. They find the keys
		// where they were: the seal comes after them.
		callsErr := ns.waitCalls(ctx)
		if ns.cold != nil {
			// The cold reads handed to goroutines: none uses the store
			// after Close returns (closing ends them, bounded by ctx).
			ns.cold.waitRuns(ctx)
		}
		// The lean decision paths do not register as calls in flight:
		// sealing the tables takes what those under way counted into the
		// flush, and refuses the rest (see shm.Table.Seal).
		ns.seal()
		close(ns.done)
		select {
		case <-ns.loopDone:
		case <-ctx.Done():
			// Abort the cycle in flight, and do not wait for it: a store
			// client may notice the cancellation only at the call's own
			// deadline (go-redis does), up to SyncTimeout later. The loop
			// then ends by itself; the flush below finds the cycle still
			// holding the sync and reports the hits it could not push.
			ns.cancel()
		}
		if ns.mode != modeLocal {
			err := ns.flush(ctx)
			if err == nil {
				// Write-throughs still in flight: the flush did not see
				// their hits, which may not reach the store.
				err = callsErr
			}
			ns.closeErr = ns.unpushed(err)
		}
		ns.cancel()
		if ns.tick != nil {
			ns.tick.close()
		}
		if ns.reg != nil {
			ns.reg.forget(ns)
		}
	})
	return ns.closeErr
}
