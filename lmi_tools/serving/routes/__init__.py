"""One router per HTTP surface of ``lmi serve``, and the answer helpers they share."""
