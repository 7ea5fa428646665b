"""`omnivoice bench`: load generators and reports that measure a running server from the client side
(chat, realtime, Twilio, soak), the in-process engine benchmark with the transformers baseline, the
graphed-vs-eager parity check, and the code predictor's kernel check."""
