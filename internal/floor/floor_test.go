package floor

import "testing"

func TestDiv(t *testing.T) {
	for _, c := range []struct{ a, b, want int64 }{
		{0, 10, 0}, {9, 10, 0}, {10, 10, 1}, {-1, 10, -1}, {-10, 10, -1}, {-11, 10, -2},
		{1<<62 + 5, 1 << 61, 2}, {-(1 << 62), 3, -1537228672809129302},
	} {
		if got := Div(c.a, c.b); got != c.want {
			t.Errorf("Div(%d, %d) = %d, want %d", c.a, c.b, got, c.want)
		}
		if q := Div(c.a, c.b); q*c.b > c.a || c.a-q*c.b >= c.b {
			t.Errorf("Div(%d, %d) = %d is not the floor", c.a, c.b, q)
		}
	}
}
