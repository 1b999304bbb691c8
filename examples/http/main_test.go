package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit/strategy/memory"
)

// TestService: the routes and limits the startup message promises.
func TestService(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, syncRate := range []time.Duration{0, 100 * time.Millisecond} {
		h, closeNS, err := newHandler(memory.New(), syncRate, func() time.Time { return now }, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		srv := httptest.NewServer(h)
		codes := func(path string, n int) []int {
			var out []int
			for range n {
				resp, err := http.Get(srv.URL + path)
				require.NoError(t, err)
				resp.Body.Close()
				out = append(out, resp.StatusCode)
			}
			return out
		}
		require.Equal(t, []int{200, 200, 200, 200, 200, 429, 429}, codes("/search", 7))
		require.Equal(t, []int{200, 200, 200, 429}, codes("/hello", 4))
		require.Equal(t, []int{429}, codes("/hello", 1))
		srv.Close()
		require.NoError(t, closeNS(context.Background()))
	}
}
