package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/httplimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// benchWriter is a ResponseWriter reused across requests, so the benchmark
// measures the handler and the middleware, not the recorder.
type benchWriter struct {
	h    http.Header
	code int
}

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *benchWriter) WriteHeader(code int)        { w.code = code }

// BenchmarkMiddleware measures the middleware's overhead per request: the
// same handler bare and behind the middleware (KeyByIP, one limit that admits
// everything, IETF headers), over 100,000 client addresses, in local and
// asynchronous modes. The overhead is limited minus bare.
func BenchmarkMiddleware(b *testing.B) {
	const clients = 100_000
	addrs := make([]string, clients)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.%d.%d.%d:443", i>>16, (i>>8)&255, i&255)
	}
	// One request per goroutine, its RemoteAddr changed each time: 100,000
	// whole requests would make the benchmark mostly garbage collection.
	template := httptest.NewRequest("GET", "/items/1", nil)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok"))
	})
	run := func(b *testing.B, h http.Handler, parallel bool) {
		b.ReportAllocs()
		runtime.GC()
		b.ResetTimer()
		if !parallel {
			w := &benchWriter{h: make(http.Header)}
			r := template.Clone(context.Background())
			for i := 0; b.Loop(); i++ {
				clear(w.h)
				r.RemoteAddr = addrs[(i*7919)%clients]
				h.ServeHTTP(w, r)
			}
			return
		}
		var seed atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			w := &benchWriter{h: make(http.Header)}
			r := template.Clone(context.Background())
			i := int(seed.Add(1) * 104729)
			for pb.Next() {
				clear(w.h)
				r.RemoteAddr = addrs[(i*7919)%clients]
				h.ServeHTTP(w, r)
				i++
			}
		})
	}
	for _, par := range []bool{false, true} {
		name := "serial"
		if par {
			name = "parallel"
		}
		b.Run("bare/"+name, func(b *testing.B) { run(b, handler, par) })
		for _, mode := range []string{"local", "async"} {
			b.Run("limited-"+mode+"/"+name, func(b *testing.B) {
				cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1}
				if mode == "async" {
					cfg.SyncRate, cfg.Strategy = time.Hour, memory.New()
				}
				reg := ratelimit.NewRegistry()
				ns, err := reg.New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = reg.Close(context.Background()) })
				mw, err := httplimit.New(httplimit.Options{Namespace: ns, Limits: []ratelimit.Limit{{Window: time.Minute, Max: 1 << 40}}})
				if err != nil {
					b.Fatal(err)
				}
				h := mw(handler)
				w := &benchWriter{h: make(http.Header)}
				r := template.Clone(context.Background())
				for _, a := range addrs { // every client known, as in steady state
					clear(w.h)
					r.RemoteAddr = a
					h.ServeHTTP(w, r)
				}
				run(b, h, par)
			})
		}
	}
}
