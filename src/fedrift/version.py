"""fedrift's version, in a module of its own so that any layer can name it without importing the
package (and with it every layer above)."""

__version__ = "0.1.0"
