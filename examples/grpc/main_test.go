package main

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit/grpclimit"
)

// The client reaches the limit, waits exactly as told (on a fake clock the
// server reads), and every call is served.
func TestClientWaitsAsTold(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	var now atomic.Int64
	now.Store(time.UnixMilli(1_700_002_800_000).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	srv, err := startServer("127.0.0.1:0", 3, clock)
	require.NoError(t, err)
	defer srv.stop()

	var out strings.Builder
	var waited time.Duration
	err = runClient(context.Background(), &out, srv.addr, 10, grpclimit.ClientOptions{
		Wait: func(_ context.Context, d time.Duration) error {
			waited += d
			now.Add(int64(d))
			return nil
		},
	})
	require.NoError(t, err, out.String())
	require.Contains(t, out.String(), "10 calls served")
	require.Contains(t, out.String(), "refused: the server says retry in")
	require.Positive(t, waited)
	require.Equal(t, 10, strings.Count(out.String(), "SERVING"))
}

func TestRunBoth(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	// Under the limit: no wait on the real clock.
	var out strings.Builder
	require.NoError(t, run(context.Background(), &out, "both", "127.0.0.1:0", 100, 3))
	require.Contains(t, out.String(), "3 calls served, 0 waits")
	require.Error(t, run(context.Background(), &out, "nonsense", "", 1, 1))
}
