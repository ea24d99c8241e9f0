//! Transaction histories and the serializability checker (in progress).
