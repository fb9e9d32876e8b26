"""After training: a finished run's model used on images of one's own (predict), exported (export), and turned on
its own training labels to rank those it disputes (suspects)."""
