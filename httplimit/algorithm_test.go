package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/httplimit"
)

// A token bucket's headers: q is the burst and w the time the burst takes to
// refill, r the whole tokens left, t the time until the bucket is full.
func TestTokenBucketHeaders(t *testing.T) {
	reg := ratelimit.NewRegistry()
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1})
	require.NoError(t, err)
	l := ratelimit.Limit{Algorithm: ratelimit.TokenBucket, Window: time.Minute, Max: 100, Burst: 10, Name: "api"}
	mw, err := httplimit.New(httplimit.Options{Namespace: ns, Limits: []ratelimit.Limit{l}, KeyFunc: httplimit.KeyByHeader("X-Key")})
	require.NoError(t, err)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	var rec *httptest.ResponseRecorder
	for range 11 {
		rec = httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Key", "k")
		h.ServeHTTP(rec, req)
	}
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	// 10 tokens at 100 per minute: refilled in 6 s.
	require.Equal(t, `"api";q=10;w=6`, rec.Header().Get("RateLimit-Policy"))
	require.Equal(t, `"api";r=0;t=6`, rec.Header().Get("RateLimit"))
	require.Equal(t, "1", rec.Header().Get("Retry-After"), "one token back in 600 ms")
	require.Contains(t, rec.Body.String(), `"limit":10,"window":6`)
	require.Contains(t, rec.Body.String(), "a burst of 10, refilling 100 per 1m0s")
}

// A rule that queues holds a request its limits reject when they admit it
// within the queue's time, and answers 429 at once when they would not.
func TestQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := ratelimit.NewRegistry()
		defer func() { _ = reg.Close(context.Background()) }()
		ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second}, SyncRate: -1})
		require.NoError(t, err)
		l := ratelimit.Limit{Algorithm: ratelimit.TokenBucket, Window: time.Second, Max: 1}
		mw, err := httplimit.New(httplimit.Options{Namespace: ns, KeyFunc: httplimit.KeyByHeader("X-Key"), Rules: []httplimit.Rule{
			{Pattern: "/wait", Limits: []ratelimit.Limit{l}, Queue: 2 * time.Second},
			{Pattern: "/short", Limits: []ratelimit.Limit{l}, Queue: 500 * time.Millisecond},
		}})
		require.NoError(t, err)
		h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		get := func(path string) (int, time.Duration) {
			start := time.Now()
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("GET", path, nil)
			req.Header.Set("X-Key", "k")
			h.ServeHTTP(rec, req)
			return rec.Code, time.Since(start)
		}
		code, took := get("/wait")
		require.Equal(t, http.StatusOK, code)
		require.Zero(t, took)
		code, took = get("/wait")
		require.Equal(t, http.StatusOK, code, "queued until the next token")
		require.Equal(t, time.Second, took)
		code, _ = get("/short")
		require.Equal(t, http.StatusOK, code, "its own counters: a fresh bucket")
		code, took = get("/short")
		require.Equal(t, http.StatusTooManyRequests, code, "a token is a second away; the queue holds 500 ms")
		require.Zero(t, took, "refused at once, without waiting in vain")
	})
}
