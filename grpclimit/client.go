package grpclimit

import (
	"context"
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ClientOptions configure UnaryClientInterceptor. The zero value is the
// documented default of every field.
type ClientOptions struct {
	// MaxRetries bounds how many times one call is retried after being
	// rate limited. Default 3; negative: never retry.
	MaxRetries int
	// MaxDelay is the longest retry delay the interceptor waits for; a call
	// told to wait longer fails at once with the server's error. Default 0:
	// no bound but the call's deadline.
	MaxDelay time.Duration
	// Wait waits d, or returns ctx's error if ctx is done first. Default: a
	// timer. Tests set it to move a fake clock instead.
	Wait func(ctx context.Context, d time.Duration) error
	// Now tells the time, to compare a wait with the call's deadline.
	// Default time.Now.
	Now func() time.Time
}

// RetryDelay returns the retry delay a rate-limited call's error carries:
// the google.rpc.RetryInfo detail of a codes.ResourceExhausted status.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			if err := ri.GetRetryDelay().CheckValid(); err != nil {
				return 0, false
			}
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}

// UnaryClientInterceptor returns an interceptor that retries a call the
// server refused with codes.ResourceExhausted and a RetryInfo detail, after
// waiting exactly the delay the server gave: the limiter's delay is the true
// earliest time the call is admitted, so no extra margin is added. It does
// not wait when the wait would end at or after the call's deadline (the call
// could not succeed) or exceed MaxDelay: the server's error is returned at
// once. Other errors, and refusals without RetryInfo, are returned as they
// are. Streams are not retried: their refusal arrives with the first
// message received, after the caller may have sent some.
func UnaryClientInterceptor(opts ClientOptions) grpc.UnaryClientInterceptor {
	if opts.MaxRetries == 0 {
		opts.MaxRetries = 3
	}
	if opts.Wait == nil {
		opts.Wait = sleep
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		for attempt := 0; ; attempt++ {
			err := invoker(ctx, method, req, reply, cc, callOpts...)
			if err == nil || attempt >= opts.MaxRetries {
				return err
			}
			d, ok := RetryDelay(err)
			if !ok || (opts.MaxDelay > 0 && d > opts.MaxDelay) {
				return err
			}
			if dl, has := ctx.Deadline(); has && !opts.Now().Add(d).Before(dl) {
				return err
			}
			if werr := opts.Wait(ctx, d); werr != nil {
				return errors.Join(err, werr)
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
