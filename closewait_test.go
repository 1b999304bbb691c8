package ratelimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// heldStore is a memory store whose pushes wait until release is closed (or
// their context is done).
type heldStore struct {
	*memory.Store
	entered chan struct{} // receives once per push that started waiting
	release chan struct{}
}

func (h *heldStore) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	h.entered <- struct{}{}
	select {
	case <-h.release:
	case <-ctx.Done():
		return strategy.Result{}, ctx.Err()
	}
	return h.Store.PushDiffs(ctx, b)
}

// Close racing a synchronous-mode write-through: Close used to flush at once
// and return nil while the write-through was still waiting on the store, so
// a hit the caller was told was counted could be lost. Close now waits for
// calls in flight (within its deadline): nil only once the hit is in the
// store, an UnpushedError that counts it otherwise.
func TestCloseWaitsForWriteThrough(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	for _, released := range []bool{true, false} {
		store := &heldStore{Store: memory.New(), entered: make(chan struct{}, 1), release: make(chan struct{})}
		reg := ratelimit.NewRegistry()
		ns, err := reg.New(ratelimit.Config{Namespace: "held", WindowSizes: []time.Duration{time.Minute},
			Strategy: store, SyncTimeout: 2 * time.Second})
		require.NoError(t, err)
		called := make(chan error, 1)
		go func() {
			_, err := ns.Increment(context.Background(), "k", time.Minute, 1)
			called <- err
		}()
		<-store.entered // the write-through waits on the store
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		if released {
			time.AfterFunc(20*time.Millisecond, func() { close(store.release) })
		}
		closeErr := reg.Close(ctx)
		cancel()
		if released {
			require.NoError(t, closeErr)
			// Read before the call returns: Close returning nil is the promise.
			n, err := store.GetWindow(context.Background(), "held",
				strategy.CounterID{Key: "k", Size: time.Minute, Start: strategy.WindowStart(time.Now().UnixMilli(), time.Minute)})
			require.NoError(t, err)
			require.Equal(t, int64(1), n, "Close returned nil: the hit is in the store")
			require.NoError(t, <-called)
			continue
		}
		var unpushed *ratelimit.UnpushedError
		require.True(t, errors.As(closeErr, &unpushed), "Close: %v", closeErr)
		require.Equal(t, int64(1), unpushed.Hits)
		close(store.release) // let the write-through end
		<-called
	}
}
