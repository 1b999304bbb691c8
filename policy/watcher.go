package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// WatchOptions configure a Watcher. The zero value of every field is a
// documented default.
type WatchOptions struct {
	// Compile configures the compilation of each version.
	Compile Options
	// Check, when set, must accept a snapshot before it is installed (for
	// example httplimit.CheckPolicy(ns)); a refused version is treated as a
	// bad document.
	Check func(*Snapshot) error
	// PollInterval is how often the watcher polls the store's current
	// version, whatever notifications say: the fallback for a lost one.
	// Default 1 s.
	PollInterval time.Duration
	// Timeout bounds each store call. Default 5 s.
	Timeout time.Duration
	// Logger receives a line per installed version and per bad one.
	// Default slog.Default().
	Logger *slog.Logger
	// OnInstall, when set, is called (from the watcher's goroutine) after a
	// snapshot is installed.
	OnInstall func(*Snapshot)
	// OnReject, when set, is called (from the watcher's goroutine) when a
	// version is refused.
	OnReject func(version int64, err error)
}

// Watcher follows a Store: it installs each new current version that
// compiles, and keeps the last good one when a version does not. It is a
// Provider for the middleware.
type Watcher struct {
	store  Store
	opts   WatchOptions
	holder Holder
	kick   chan struct{} // capacity 1
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	mu        sync.Mutex
	stats     WatchStats // GUARDED_BY(mu)
	badNumber int64      // GUARDED_BY(mu): last version that failed to compile
}

// WatchStats describe a Watcher.
type WatchStats struct {
	// Version is the version enforced (0: none yet).
	Version int64
	// Installs counts versions installed.
	Installs uint64
	// Notifications counts notifications received; Polls counts polls.
	Notifications, Polls uint64
	// InstalledByPoll counts installs that a poll found first (a
	// notification was lost or late).
	InstalledByPoll uint64
	// Rejected counts versions refused (bad document or refused by Check);
	// LastRejected is the last one's number and LastError its error.
	Rejected     uint64
	LastRejected int64
	LastError    string
	// StoreErrors counts failed store calls.
	StoreErrors uint64
	// LoadTime is how long installing the version in force took: reading
	// it from the store, parsing, compiling and checking it, swapping it in.
	LoadTime time.Duration
	// SlowParses counts the versions installed that were outside the plain
	// YAML (or JSON) that Parse reads fast: a document with anchors, tags,
	// block or multi-line scalars, or numbers in other forms than decimal
	// integers, is read by the full YAML decoder, about thirty times
	// slower (a second for 100,000 overrides).
	SlowParses uint64
}

// NewWatcher loads the store's current version (an error if the store fails
// or that version is bad: a node should not start without its policy; an
// empty store gives a nil snapshot) and starts following the store until
// Close.
func NewWatcher(ctx context.Context, store Store, opts WatchOptions) (*Watcher, error) {
	if opts.PollInterval < 0 || opts.Timeout < 0 {
		return nil, errors.New("policy: WatchOptions.PollInterval and Timeout must not be negative")
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = time.Second
	}
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	w := &Watcher{store: store, opts: opts, kick: make(chan struct{}, 1), done: make(chan struct{})}
	lctx, cancel := context.WithCancel(context.Background())
	// Subscribe before the first read, so no change falls between them.
	notes := w.subscribe(lctx)
	err := w.refresh(ctx, false)
	if err == nil && w.stats.Rejected > 0 {
		err = fmt.Errorf("policy: current version %d: %s", w.stats.LastRejected, w.stats.LastError)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	w.cancel = cancel
	go w.loop(lctx, notes)
	return w, nil
}

// subscribe returns the store's notifications, or nil (then the loop polls
// and subscribes again at the next tick).
func (w *Watcher) subscribe(ctx context.Context) <-chan struct{} {
	c, err := w.store.Subscribe(ctx)
	if err != nil {
		w.storeError("subscribe", err)
		return nil
	}
	return c
}

// Load returns the snapshot in force (nil when the store held none).
func (w *Watcher) Load() *Snapshot { return w.holder.Load() }

// Stats returns the watcher's state and counters.
func (w *Watcher) Stats() WatchStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

// Refresh asks the watcher to read the store now (it does not wait).
func (w *Watcher) Refresh() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Close stops the watcher; the last snapshot stays in force. Idempotent.
func (w *Watcher) Close() error {
	w.once.Do(func() {
		w.cancel()
		<-w.done
	})
	return nil
}

func (w *Watcher) loop(ctx context.Context, notes <-chan struct{}) {
	defer close(w.done)
	tick := time.NewTicker(w.opts.PollInterval)
	defer tick.Stop()
	for {
		byPoll := false
		select {
		case <-ctx.Done():
			return
		case _, ok := <-notes:
			if !ok {
				notes = nil // resubscribed at the next tick
				continue
			}
			w.count(func(s *WatchStats) { s.Notifications++ })
		case <-w.kick:
		case <-tick.C:
			byPoll = true
			w.count(func(s *WatchStats) { s.Polls++ })
			if notes == nil {
				notes = w.subscribe(ctx)
			}
		}
		_ = w.refresh(ctx, byPoll)
	}
}

func (w *Watcher) count(f func(*WatchStats)) {
	w.mu.Lock()
	f(&w.stats)
	w.mu.Unlock()
}

func (w *Watcher) storeError(op string, err error) {
	w.count(func(s *WatchStats) { s.StoreErrors++ })
	w.opts.Logger.Warn("policy: store failed", "op", op, "error", err)
}

// refresh installs the store's current version if it is new and good. It
// returns only store errors.
func (w *Watcher) refresh(ctx context.Context, byPoll bool) error {
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, w.opts.Timeout)
	defer cancel()
	n, err := w.store.Current(cctx)
	if err != nil {
		w.storeError("current", err)
		return err
	}
	w.mu.Lock()
	same := n == w.stats.Version || n == w.badNumber
	w.mu.Unlock()
	if same || n == 0 {
		return nil
	}
	v, err := w.store.Get(cctx, n)
	if err != nil {
		w.storeError("get", err)
		return err
	}
	s, err := Load(v.Doc, n, w.opts.Compile)
	if err == nil && w.opts.Check != nil {
		err = w.opts.Check(s)
	}
	if err != nil {
		w.mu.Lock()
		w.badNumber = n
		w.stats.Rejected++
		w.stats.LastRejected = n
		w.stats.LastError = err.Error()
		old := w.stats.Version
		w.mu.Unlock()
		w.opts.Logger.Error("policy: bad version refused; the last good one stays in force", "version", n, "enforced", old, "error", err)
		if w.opts.OnReject != nil {
			w.opts.OnReject(n, err)
		}
		return nil
	}
	w.holder.Store(s)
	took := time.Since(start)
	w.mu.Lock()
	w.stats.Version = n
	w.stats.Installs++
	w.stats.LoadTime = took
	if s.slow {
		w.stats.SlowParses++
	}
	if byPoll {
		w.stats.InstalledByPoll++
	}
	w.mu.Unlock()
	w.opts.Logger.Info("policy: version installed", "version", n, "load_time", took, "slow_parse", s.slow)
	if w.opts.OnInstall != nil {
		w.opts.OnInstall(s)
	}
	return nil
}
